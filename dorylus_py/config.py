"""The one typed configuration of a training run, passed everywhere and saved as ``config.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dorylus_py.errors import ConfigError

BACKENDS = ("reference",)
FEATURE_NORMS = ("auto", "row", "none")


@dataclass(frozen=True)
class TrainConfig:
    data: str | None = None  # dataset path; None = a generated graph (see `dorylus synth`)
    backend: str = "reference"  # where the work runs; `reference` is the single-process oracle
    layers: int = 2  # GCN layers (weight matrices)
    hidden: int = 16  # width of every hidden layer
    dropout: float = 0.5  # on each layer's input, as in Kipf & Welling
    weight_decay: float = 5e-4  # L2 on the first layer only (the paper's choice)
    lr: float = 0.01  # Adam learning rate
    epochs: int = 200
    seed: int = 0  # weights init and dropout
    feature_norm: str = "auto"  # `row`: rows scaled to sum 1 (bag-of-words practice); `auto`: row if all >= 0
    threads: int = 0  # torch intra-op threads; 0 = torch's default

    def check(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.layers < 1:
            raise ConfigError(f"--layers must be >= 1, got {self.layers}")
        if self.hidden < 1:
            raise ConfigError(f"--hidden must be >= 1, got {self.hidden}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.weight_decay < 0 or self.lr <= 0:
            raise ConfigError("--lr must be > 0 and --weight-decay >= 0")
        if self.epochs < 1:
            raise ConfigError(f"--epochs must be >= 1, got {self.epochs}")
        if self.feature_norm not in FEATURE_NORMS:
            raise ConfigError(f"--feature-norm must be one of {', '.join(FEATURE_NORMS)}")
        if self.threads < 0:
            raise ConfigError(f"--threads must be >= 0, got {self.threads}")

    def to_dict(self) -> dict:
        return asdict(self)
