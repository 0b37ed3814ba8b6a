"""What a planned run will import, why, and which install extra provides it.

A run that starts and then dies on a missing module wastes a queue wait (on a cluster) or
a minute of start-up (on CPU), and its error is a traceback per rank. The modules a run
imports follow from its config: megatron-core always; einops when the CP topology passes
``--hierarchical-context-parallel-sizes`` (megatron-core's ``parallel_state`` builds those
groups with it, and only then imports it); Megatron's training loop on GPUs; the tokenizer's
library. `run --dry-run`, `run` itself and the sbatch pre-flight import exactly this list
(``import_problem``), and a test checks that every entry's package is in the named extra of
setup.py, so a fresh install with the extras the message names has them all.
"""
from __future__ import annotations

import dataclasses
import importlib
import warnings

from ..config.schema import Config
from ..config.burst import topology_of


@dataclasses.dataclass(frozen=True)
class Need:
    """One module a run imports: the part of the run that needs it, and how to install it."""

    module: str
    package: str  # the distribution that provides it (as setup.py names it)
    extra: str  # the extra of megatron-burst that installs it
    why: str

    def install(self) -> str:
        return f"pip install -e '.[{self.extra}]' in the megatron-burst checkout"

    def missing(self, error: BaseException | None = None) -> str:
        """One line: the module is missing, what needs it, how to get it."""
        seen = f" ({type(error).__name__}: {error})" if error is not None else ""
        return (f"{self.module} does not import{seen}: {self.why}; {self.install()} "
                f"(package {self.package})")


TRAINING = Need("megatron.training", "megatron-core>=0.17", "train",
                "the GPU entry point runs Megatron's training loop: megatron-core >= 0.17 "
                "(Python >= 3.12), or a Megatron-LM checkout on PYTHONPATH (core_v0.18.0 and "
                "later need Python >= 3.12, core_v0.17.x runs on 3.11)")
TOKENIZER_NEEDS = {
    "HuggingFaceTokenizer": Need("transformers", "transformers", "train",
                                 "Megatron's HuggingFaceTokenizer loads data.tokenizer_model "
                                 "with transformers"),
    "Llama2Tokenizer": Need("sentencepiece", "sentencepiece", "train",
                            "Megatron's Llama2Tokenizer reads data.tokenizer_model with "
                            "sentencepiece"),
}


def run_needs(cfg: Config) -> list[Need]:
    """Every module the run of ``cfg`` imports beyond torch, in the order a run meets them."""
    on_cpu = not cfg.cluster.hardware.timed
    needs = [Need("megatron.core.parallel_state", "megatron-core", "megatron",
                  "the run builds its model and process groups with megatron-core")]
    if on_cpu:  # megatron-core's GPTModel imports modules that need triton importable
        needs.append(Need("triton", "triton", "megatron",
                          "the CPU run builds megatron-core's GPTModel, whose imports need "
                          "triton"))
    topology = topology_of(cfg) if cfg.parallel.context > 1 else None
    if topology is not None and topology.hierarchical_sizes:
        needs.append(Need("einops", "einops", "megatron",
                          f"megatron-core builds the CP groups of "
                          f"--hierarchical-context-parallel-sizes "
                          f"{' '.join(map(str, topology.hierarchical_sizes))} "
                          f"({topology.describe()}) "
                          f"with einops"))
    if not on_cpu:
        needs.append(TRAINING)
    if not cfg.data.mock:
        if on_cpu:
            needs.append(Need("tokenizers", "tokenizers", "data",
                              "the CPU run on text reads data.tokenizer_model with tokenizers"))
        elif cfg.data.tokenizer_type in TOKENIZER_NEEDS:
            needs.append(TOKENIZER_NEEDS[cfg.data.tokenizer_type])
    return needs


def import_problem(needs: list[Need]) -> str | None:
    """Import every module of ``needs`` here; None if all import, else the first failure."""
    for need in needs:
        try:
            with warnings.catch_warnings():  # megatron-core warns at import of what it lacks
                warnings.simplefilter("ignore")
                importlib.import_module(need.module)
        except Exception as error:  # noqa: BLE001 - any failure to import stops the run
            if need is TRAINING:  # which Megatron, on which Python: environment knows
                from ...megatron.environment import missing_training_message
                return missing_training_message(error)
            return need.missing(error)
    return None
