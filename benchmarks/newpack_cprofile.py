"""Where a new document pack's host time goes: cProfile of burst_attn, call by call.

    torchrun --nproc_per_node=2 benchmarks/newpack_cprofile.py > OUT.txt

whole_docs, causal, 8K tokens per GPU, 16:4 heads, d 64, bf16, forward + backward: 30 calls
with a new uniform pack each (``documents.pack_lengths``), then 30 of one pack, each call
profiled alone (a synchronise before and after it); rank 0 prints the stats by own and by
cumulative time, and the median host ms of 19 more calls of each kind, unprofiled.
"""
import cProfile, io, os, pstats, random, sys, time, torch, torch.distributed as dist
sys.path.insert(0, "benchmarks")
import megatron_burst as mb
from documents import pack_lengths, boundaries
from ranks import start_ranks

rank, world = start_ranks()
dev = torch.device("cuda", torch.cuda.current_device())
n = 8192
q = torch.randn(1, n, 16, 64, device=dev, dtype=torch.bfloat16, requires_grad=True)
k, v = (torch.randn(1, n, 4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
do = torch.randn_like(q)
packs = [boundaries(pack_lengths(n * world, "uniform", seed=i)) for i in range(60)]
def call(cu):
    mb.burst_attn(q, k, v, causal=True, layout="whole_docs", cu_seqlens=cu).backward(do)
for cu in packs[:10]: call(cu)
torch.cuda.synchronize()
for label, sel in (("new", packs[10:40]), ("same", [packs[40]] * 30)):
    call(sel[0]); torch.cuda.synchronize()
    host = []
    pr = cProfile.Profile()
    for cu in sel:
        torch.cuda.synchronize(); t0 = time.perf_counter()
        pr.enable(); call(cu); pr.disable()
        host.append(time.perf_counter() - t0); torch.cuda.synchronize()
    # unprofiled host time
    clean = []
    for cu in (packs[41:60] if label == "new" else sel[:19]):
        torch.cuda.synchronize(); t0 = time.perf_counter(); call(cu); clean.append(time.perf_counter() - t0); torch.cuda.synchronize()
    if rank == 0:
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s); st.sort_stats("tottime").print_stats(45)
        st.sort_stats("cumtime").print_stats(60)
        print(f"=== {label}: host ms profiled median {sorted(host)[len(host)//2]*1e3:.2f}, unprofiled median {sorted(clean)[len(clean)//2]*1e3:.2f}")
        print(s.getvalue())
dist.destroy_process_group()
