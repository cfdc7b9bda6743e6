"""A user verifier imported by dotted path in test_rewards (conftest puts this folder on sys.path)."""


def length_is_three(response: str, answer: str) -> float:
    return float(len(response) == 3)
