"""Installs megatron_burst: BurstAttention context parallelism for Megatron-Core."""
from setuptools import find_packages, setup

setup(
    name="megatron-burst",
    version="0.1.0",
    description="BurstAttention: exact context-parallel attention as a Megatron-Core backend",
    packages=find_packages(include=["megatron_burst", "megatron_burst.*"]),
    package_data={"megatron_burst": ["profiles/*.json"]},
    python_requires=">=3.11",
    # torch first and pinned by range: a bare "torch" would pull a CUDA build on CPU hosts.
    install_requires=["torch>=2.5,<2.14", "pyyaml>=6"],
    extras_require={
        "megatron": ["megatron-core>=0.16", "triton"],
        "test": ["pytest>=8", "pytest-timeout"],
    },
    entry_points={"console_scripts": ["megatron-burst=megatron_burst.launch.cli:main"]},
)
