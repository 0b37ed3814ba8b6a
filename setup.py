"""Installs megatron_burst: BurstAttention context parallelism for Megatron-Core."""
from setuptools import find_packages, setup

setup(
    name="megatron-burst",
    version="0.1.0",
    description="BurstAttention: exact context-parallel attention as a Megatron-Core backend",
    packages=find_packages(include=["megatron_burst", "megatron_burst.*"]),
    package_data={"megatron_burst": ["profiles/*.json", "launch/config/megatron_options.json"]},
    python_requires=">=3.11",
    # torch first and pinned by range: a bare "torch" would pull a CUDA build on CPU hosts.
    install_requires=["torch>=2.5,<2.14", "pyyaml>=6", "numpy"],
    extras_require={
        # The layer spec, the adapter and the CPU run: 0.16.1 on Python 3.11 is enough.
        # megatron-core imports einops only to build hierarchical CP groups (the double ring
        # and Ulysses x ring pass --hierarchical-context-parallel-sizes) and triton for its
        # GPT model's imports; it declares neither. launch/run/runtime_deps.py lists what each
        # run imports, and a test checks every entry is in the extra its message names.
        "megatron": ["megatron-core>=0.16", "triton", "einops"],
        # The GPU entry point (python -m megatron_burst.megatron.pretrain_gpt) is built on
        # megatron.training, which megatron-core ships from 0.17 on, and those wheels need
        # Python >= 3.12; on 3.11 put a Megatron-LM core_v0.17.x checkout on PYTHONPATH
        # instead (core_v0.18.0 and later import typing.override, new in 3.12). transformers
        # is what Megatron's HuggingFaceTokenizer loads the configs' tokenizers with, and
        # sentencepiece what its Llama2Tokenizer reads.
        "train": ['megatron-core>=0.17; python_version >= "3.12"', "transformers>=4.40",
                  "sentencepiece"],
        # `megatron-burst data`: read a tokenizer.json, train the sample corpus's BPE.
        "data": ["tokenizers>=0.15"],
        "test": ["pytest>=8", "pytest-timeout"],
    },
    entry_points={"console_scripts": ["megatron-burst=megatron_burst.cli:main"]},
)
