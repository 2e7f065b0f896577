"""Write your own task: a federated logistic regression, registered and run like NS-FL.

Run:  python examples/write_a_task.py [--rounds N] [--out DIR]

A task says what a hospital trains (its named modules) and how; the run, the secure mode, the
transport and the audit are Clinograph's (docs/write_a_task.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from clinograph.sdk.federation.task_base import SplitEvaluation
from clinograph.sdk.model.modules import ModuleMap, Piece
from clinograph.sdk.seeding import torch_seeded
from clinograph.sdk.training.trainer import TrainOutcome

import clinograph as cg
from clinograph.core.spec import ModuleKind

HERE = Path(__file__).parent


def logistic_modules(config, *, dictionary) -> ModuleMap:
    """One shared module per parameter, from the config alone: every hospital and the server start from the same.
    Built inside ``torch_seeded(init_seed)``: an initialisation that draws (``nn.Linear``) draws the same numbers
    everywhere, and the host process's own torch generator is put back after (zeros draw nothing here)."""
    with torch_seeded(config.model.init_seed):
        weights = torch.nn.Parameter(torch.zeros(len(dictionary.node_ids()), dtype=torch.float64))
        bias = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    modules = ModuleMap()
    modules.add("logistic/weights", ModuleKind.SHARED, [Piece(weights)])
    modules.add("logistic/bias", ModuleKind.SHARED, [Piece(bias)])
    return modules


class LogisticTask(SplitEvaluation):
    """Logistic regression on the standardised features (missing = 0), full-batch gradient steps.
    ``SplitEvaluation`` (a ``cg.TaskBase``) gives ``evaluate(split)`` from ``table``, ``split`` and ``predict``."""

    name = "logistic"

    def __init__(self, table, *, dictionary, config, split, state_dir=None, identity=None):
        self.table, self.split, self.config = table, split, config
        self.modules = logistic_modules(config, dictionary=dictionary)
        values, _ = table.dense()
        self.x = torch.from_numpy(np.nan_to_num(values))
        self.y = torch.from_numpy(table.labels.astype(float))

    @property
    def num_samples(self) -> int:
        return len(self.split.train)

    def _params(self):
        return [p.param for n in self.modules.names() for p in self.modules.pieces(n)]

    def train(self, *, round_, epochs, plan_options) -> TrainOutcome:
        w, b = self._params()
        opt = torch.optim.SGD([w, b], lr=0.5)
        idx = torch.from_numpy(self.split.train)
        for _ in range(epochs * 5):
            opt.zero_grad()
            logits = self.x[idx] @ w + b
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, self.y[idx])
            loss.backward()
            opt.step()
        return TrainOutcome(loss=float(loss.detach()), used_similar_to=False)

    def trained_modules(self, outcome) -> list[str]:
        return self.modules.names(ModuleKind.SHARED)

    def predict(self) -> np.ndarray:
        w, b = self._params()
        with torch.no_grad():
            return torch.sigmoid(self.x @ w + b).numpy()


cg.register_task("logistic", build=LogisticTask, modules=logistic_modules)


def main(rounds: int, out: Path) -> None:
    config = cg.SimulationConfig.from_toml(HERE / "simulation.toml")
    config = config.model_copy(update={"task": "logistic", "output": out,
                                       "federation": config.federation.model_copy(update={"rounds": rounds})})
    result = cg.simulate_from_config(config, on_round=lambda r, m: print(
        f"round {r}: " + ", ".join(f"{site} AUROC {v['auroc']:.3f}" for site, v in sorted(m.items()))))
    verdict = cg.verify_audit_dir(result.audit_dir)
    print(f"task {config.task!r}, secure mode {config.federation.secure_mode}: audit "
          f"{'verified' if verdict.ok else 'FAILED: ' + verdict.problems[0]}")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    main(a.rounds, a.out or Path(tempfile.mkdtemp()) / "logistic")
