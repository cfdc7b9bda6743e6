"""A user verifier imported by dotted path in test_rewards (conftest puts this folder on sys.path)."""


def length_is_three(response: str, answer: str) -> float:
    return float(len(response) == 3)


def varied_if_answer_even(response: str, answer: str) -> float:
    """Zero-variance groups for answers starting with an odd digit (dynamic sampling drops them)."""
    if int(answer[0]) % 2:
        return 0.0
    return float(len(response)) + float(response[:1] == answer[:1])


CALLS = {"n": 0}


def fails_after_64_calls(response: str, answer: str) -> float:
    """Scores like exact match for two steps of 32 responses, then raises (a broken user verifier)."""
    CALLS["n"] += 1
    if CALLS["n"] > 64:
        raise RuntimeError("verifier crashed")
    return float(response == answer)


def pays_for_format(response: str, answer: str) -> float:
    """A hackable reward (the audit's test): 1 for any response of the answer's width in digits, right
    or wrong."""
    text = response.strip()
    return float(len(text) == len(answer) and text.isdigit())


def pays_for_length(response: str, answer: str) -> float:
    """A hackable reward (the audit's test): the longer the response, the more it earns, whatever it says."""
    return min(len(response), 23) / 23
