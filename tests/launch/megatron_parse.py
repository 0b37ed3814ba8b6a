"""Feed every config's flags to a newer Megatron's own parser, in a process of its own.

    python tests/launch/megatron_parse.py MEGATRON_PATH CONFIG...

The megatron-core wheel that installs on Python 3.11 (0.16.1) has no ``megatron.training``;
the 0.17+ wheels do but declare Python >= 3.12. Their argument parser is pure Python and
imports on 3.11 once ``typing.override`` (a 3.12 name) exists, so CI unpacks such a wheel
at MEGATRON_PATH and runs this script, which puts it first on sys.path. Exit status 0
means every config's flags passed ``parse_args`` and ``validate_args``, the attention
variant (sinks, windows, MLA) reads back as the config says, and the CP topology read back
from the parsed arguments is the one the config plans; otherwise every failing config is
named.
"""
from __future__ import annotations

import os
import sys
import typing

import typing_extensions

typing.override = getattr(typing, "override", typing_extensions.override)
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import megatron.training.arguments as arguments  # noqa: E402

from megatron_burst.launch.config.burst import topology_of  # noqa: E402
from megatron_burst.megatron.resolve import topology_from_args  # noqa: E402
from megatron_burst.launch.config.schema import load_config  # noqa: E402
from megatron_burst.launch.run.flags import megatron_flags  # noqa: E402
from megatron_burst.megatron.arguments import add_burst_args  # noqa: E402

ENV = {"DATA_PATH": "/data/corpus_text_document", "TOKENIZER_MODEL": "/tok/tokenizer.model"}
# validate_args asks the GPU generation; answer as the A100s the configs are for.
arguments.get_device_arch_version = lambda: 8
os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"


def check(path: str) -> None:
    """Parse and validate one config's flags; the topology read back is the plan's."""
    cfg = load_config(path)
    sys.argv = ["pretrain_gpt", *megatron_flags(cfg, env=ENV, save="/ckpt", load="/ckpt")]
    os.environ["WORLD_SIZE"] = str(cfg.cluster.world_size)
    args = arguments.parse_args(extra_args_provider=add_burst_args)
    args.world_size = cfg.cluster.world_size
    arguments.validate_args(args, {})
    assert (args.data_parallel_size, args.context_parallel_size,
            args.tensor_model_parallel_size) == (cfg.parallel.data, cfg.parallel.context,
                                                 cfg.parallel.tensor), path
    m = cfg.model  # the attention variant reaches Megatron as the config says
    assert (args.softmax_type, args.multi_latent_attention) == (
        m.softmax_type, m.multi_latent_attention), path
    assert args.window_size == m.window and args.window_attn_skip_freq == \
        m.window_attn_skip_freq, path
    if cfg.parallel.context > 1:  # the adapter's topology from these args is the plan's
        adapter, planned = topology_from_args(args), topology_of(cfg)
        assert adapter == planned, f"{path}: the adapter reads {adapter}, the plan {planned}"


failed = []
for path in sys.argv[2:]:
    try:
        check(path)
        print("ok", os.path.basename(path), flush=True)
    except (AssertionError, SystemExit, Exception) as e:  # every config is checked
        failed.append(f"{os.path.basename(path)}: {type(e).__name__}: {e}")
if failed:
    sys.exit("failed:\n" + "\n".join(failed))
