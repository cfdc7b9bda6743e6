"""The seed's TransferDock / GRPOTransferDock, implemented literally, as the benchmark baseline.

Each cell is a Python list element holding a per-row tensor (a view of the producer's padded
tensor, as the seed's remove-padding step returns), statuses are one int32 tensor per column and
per consumer, every get rebuilds the ready mask from every column's status and pads on the way out,
and waiting for explicit indexes polls with sleep(0.1). Not part of the package.
"""

from __future__ import annotations

import threading
import time

import torch
from tensordict import TensorDict
from torch.nn.utils.rnn import pad_sequence


def remove_padding_tensor_dict_to_dict(data: TensorDict) -> dict[str, list[torch.Tensor]]:
    """Padded TensorDict (+ `<col>_length` entries) -> column -> list of per-row views."""
    out: dict[str, list[torch.Tensor]] = {}
    for key in data.keys():  # noqa: SIM118 - a TensorDict iterates over rows
        if key.endswith("__length"):
            continue
        value, lengths = data[key], data[f"{key}__length"].tolist()
        out[key] = [value[i][: lengths[i]] for i in range(len(lengths))]
    return out


def padding_dict_to_tensor_dict(experience: dict[str, list[torch.Tensor]], pad_id: float = 0) -> TensorDict:
    """column -> list of per-row tensors -> padded TensorDict with `<col>__length`."""
    batch: dict[str, torch.Tensor] = {}
    for key, rows in experience.items():
        batch[key] = pad_sequence(rows, batch_first=True, padding_value=pad_id)
        batch[f"{key}__length"] = torch.tensor([row.numel() for row in rows])
    return TensorDict(batch, batch_size=[len(next(iter(experience.values())))])


class SeedTransferDock:
    """GRPOTransferDock as the seed describes it."""

    def __init__(self, prompts_num: int, n_samples_per_prompt: int, columns: list[str], consumers: list[str]):
        self.prompts_num = prompts_num
        self.n_samples_per_prompt = n_samples_per_prompt
        self.max_len = prompts_num * n_samples_per_prompt
        self.experience_columns = columns
        self.experience_data = {key: [None for _ in range(self.max_len)] for key in columns}
        self.experience_data_status = {key: torch.zeros(self.max_len, dtype=torch.int32) for key in columns}
        self.experience_consumer_status = {
            key: torch.zeros(self.max_len, dtype=torch.int32) for key in consumers
        }
        self.consumer_sampling_lock = {key: threading.Lock() for key in consumers}

    def _put(
        self, experience_columns: list[str], experience: list[list[torch.Tensor]], indexes: list[int]
    ) -> None:
        for column_idx, single_column in enumerate(experience_columns):
            for i, index in enumerate(indexes):
                self.experience_data[single_column][index] = experience[column_idx][i]
            self.experience_data_status[single_column][indexes] = 1

    def _wait_for_data(self, experience_columns: list[str], indexes: list[int]) -> None:
        while not all(
            int(self.experience_data_status[c][indexes].sum()) == len(indexes) for c in experience_columns
        ):
            time.sleep(0.1)

    def _get(self, experience_columns: list[str], indexes: list[int]) -> list[list[torch.Tensor]]:
        self._wait_for_data(experience_columns, indexes)
        return [[self.experience_data[c][i] for i in indexes] for c in experience_columns]

    def put_experience(self, data_dict: TensorDict, indexes: list[int]) -> None:
        experience = remove_padding_tensor_dict_to_dict(data_dict)
        columns = list(experience)
        self._put(columns, [experience[c] for c in columns], indexes)

    def put_prompts_experience(self, prompts: list[torch.Tensor]) -> list[int]:
        fanned = [p for p in prompts for _ in range(self.n_samples_per_prompt)]
        lengths = [torch.tensor([p.numel()]) for p in fanned]
        indexes = list(range(len(fanned)))
        self.put_experience(
            padding_dict_to_tensor_dict({"prompts": fanned, "prompt_length": lengths}), indexes
        )
        return indexes

    def _sample_ready_index_n_samples(
        self, consumer: str, experience_count: int, experience_columns: list[str]
    ):
        n = self.n_samples_per_prompt
        count_n_samples = experience_count // n
        with self.consumer_sampling_lock[consumer]:
            consumer_status = (
                1
                - torch.all(
                    torch.reshape(self.experience_consumer_status[consumer], (self.prompts_num, n)) == 0,
                    dim=1,
                ).int()
            )
            not_consumed = consumer_status == 0
            status_n = {
                key: torch.all(torch.reshape(value, (self.prompts_num, n)) == 1, dim=1).int()
                for key, value in self.experience_data_status.items()
            }
            data_ready = torch.all(torch.stack([status_n[c] == 1 for c in experience_columns]), dim=0)
            usable = (not_consumed & data_ready).nonzero(as_tuple=True)[0]
            if len(usable) < count_n_samples:
                return None
            sampled = [int(i) for i in usable[:count_n_samples]]
            indexes = []
            for group in sampled:
                indexes += list(range(group * n, (group + 1) * n))
            self.experience_consumer_status[consumer][indexes] = 1
        return indexes

    def get_experience(self, consumer: str, experience_columns: list[str], experience_count: int):
        indexes = self._sample_ready_index_n_samples(consumer, experience_count, experience_columns)
        if not indexes:
            return None, None
        experience = self._get(experience_columns, indexes)
        batch = padding_dict_to_tensor_dict(dict(zip(experience_columns, experience, strict=True)))
        return batch, indexes

    def held_bytes(self) -> int:
        """Bytes of every tensor storage the stored rows keep alive (their producers' padded tensors)."""
        storages = {}
        for rows in self.experience_data.values():
            for row in rows:
                if row is not None:
                    storage = row.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())

    def all_consumed(self, consumer: str) -> bool:
        return int(self.experience_consumer_status[consumer].sum()) == self.max_len
