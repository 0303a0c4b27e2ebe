"""cpu_compare.py — flexh2o beside Hugging Face transformers and accelerate on the CPU (issue #13).

A developer tool, not run by CI (it needs torch). Builds random-weight checkpoints (HF
save_pretrained, safetensors; OPT shapes, --models llama3.2-1b,qwen3-0.6b for the LLaMA path and
qwen3-moe-1b for a mixture of experts, gemma2-0.5b for Gemma 2), then runs each system on the same workload, interleaved, best of
N, and times it by FlexGen's rule: tokens generated / (prefill + decode) wall time.
  flexh2o-mem   flexh2o bench, everything in memory on the CPU device
  flexh2o-disk  flexh2o bench, weights on disk (--percent 0 0 100 0 100 0 --offload-dir)
  hf-mem        transformers generate, greedy, weights in memory (PyTorch CPU)
  acc-disk      accelerate disk_offload (weights in an offload folder), then generate
"""
import argparse, csv, json, os, subprocess, sys, tempfile, time

# OPT shapes, and LLaMA-path ones: Llama 3.2 1B (GQA, tied head, rope_type llama3), Qwen3 0.6B
# (q_norm / k_norm, head_dim 128 over hidden 1024), a small Qwen3-MoE and a small Gemma 2.
OPT_SHAPES = {"opt-125m": (768, 12, 12, 3072), "opt-1.3b": (2048, 24, 32, 8192)}
LLAMA_SHAPES = {
    "llama3.2-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                               high_freq_factor=4.0,
                                                               original_max_position_embeddings=8192)),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0),
    # Qwen3-30B-A3B's structure scaled down: 32 experts of 512, 4 a token (1.0 B parameters, 0.3 B active).
    "qwen3-moe-1b": dict(model_type="qwen3_moe", hidden_size=1024, num_hidden_layers=16, num_attention_heads=16,
                         num_key_value_heads=4, head_dim=64, intermediate_size=3072, moe_intermediate_size=512,
                         num_experts=32, num_experts_per_tok=4, norm_topk_prob=True, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0),
    # Gemma-2-2B's structure scaled down (its 256k vocabulary kept): GeGLU, four norms a layer, soft caps
    # 50 / 30, alternating sliding-window layers (0.45 B parameters, 0.26 B of them the tied table).
    "gemma2-0.5b": dict(model_type="gemma2", hidden_size=1024, num_hidden_layers=12, num_attention_heads=8,
                        num_key_value_heads=4, head_dim=128, intermediate_size=4096, vocab_size=256000,
                        query_pre_attn_scalar=128, sliding_window=4096, hidden_activation="gelu_pytorch_tanh"),
}

def make_checkpoint(name, out):
    if os.path.exists(os.path.join(out, "config.json")):
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, OPTConfig
    if name in OPT_SHAPES:
        h, layers, heads, ffn = OPT_SHAPES[name]
        cfg = OPTConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
                        word_embed_proj_dim=h, vocab_size=50272, max_position_embeddings=2048,
                        torch_dtype="float16")
    else:
        kw = dict(LLAMA_SHAPES[name])
        cfg = AutoConfig.for_model(kw.pop("model_type"), max_position_embeddings=4096, torch_dtype="float16", **kw)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.float16)
    model.save_pretrained(out, safe_serialization=True)

def run_flexh2o(exe, ckpt, a, disk, workdir):
    cmd = [exe, "bench", "-m", ckpt, "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len),
           "--num-prompts", str(a.seqs), "--device", "cpu", "--threads", str(a.threads)]
    if disk:
        cmd += ["--percent", "0", "0", "100", "0", "100", "0", "--gpu-batch-size", str(a.seqs),
                "--num-gpu-batches", "1", "--offload-dir", os.path.join(workdir, "fh-store"), "--trust-store"]
    rep = os.path.join(workdir, "report.json")
    subprocess.run(cmd + ["--report", rep], check=True, timeout=a.cap, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    r = json.load(open(rep))
    return r["generated_tokens"] / (r["prefill_seconds"] + r["decode_seconds"])

def run_hf(ckpt, a, disk, workdir):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float32)
    if disk:
        from accelerate import disk_offload
        disk_offload(model, offload_dir=os.path.join(workdir, "acc-offload"), execution_device=torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, 50000, (a.seqs, a.prompt_len), generator=g)
    with torch.inference_mode():
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=a.gen_len, min_new_tokens=a.gen_len)
        dt = time.perf_counter() - t
    return (out.shape[1] - a.prompt_len) * a.seqs / dt

def main():
    p = argparse.ArgumentParser()
    p.add_argument("--flexh2o", required=True)
    p.add_argument("--models", default="opt-125m,opt-1.3b")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=32)
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--cap", type=int, default=240, help="seconds per run")
    p.add_argument("--ckpt-dir", default="/work/compare-ckpt")
    p.add_argument("--systems", default="flexh2o-mem,flexh2o-disk,hf-mem,acc-disk")
    p.add_argument("--csv", default="bench/compare/cpu_compare.csv")
    p.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one Python system in a child
    a = p.parse_args()
    if a.one:
        sysname, ckpt, workdir = a.one.split(",")
        print(run_hf(ckpt, a, sysname == "acc-disk", workdir))
        return
    systems = a.systems.split(",")
    rows = []
    for m in a.models.split(","):
        ckpt = os.path.join(a.ckpt_dir, m)
        make_checkpoint(m, ckpt)
        best = {s: 0.0 for s in systems}
        with tempfile.TemporaryDirectory(dir="/tmp") as wd:
            for rep in range(a.repeats):  # interleaved: every system once per round
                for s in systems:
                    try:
                        if s.startswith("flexh2o"):
                            v = run_flexh2o(a.flexh2o, ckpt, a, s == "flexh2o-disk", wd)
                        else:  # a fresh process per run: same threads, no state carried over
                            r = subprocess.run([sys.executable, __file__, "--flexh2o", a.flexh2o,
                                                "--prompt-len", str(a.prompt_len), "--gen-len", str(a.gen_len),
                                                "--seqs", str(a.seqs), "--threads", str(a.threads),
                                                "--one", f"{s},{ckpt},{wd}"], check=True, timeout=a.cap,
                                               capture_output=True, text=True)
                            v = float(r.stdout.strip().splitlines()[-1])
                    except (subprocess.TimeoutExpired, subprocess.CalledProcessError) as e:
                        print(f"  {m} {s}: failed or over {a.cap} s ({type(e).__name__})", flush=True)
                        v = 0.0
                    print(f"  {m} round {rep + 1} {s}: {v:.2f} tok/s", flush=True)
                    best[s] = max(best[s], v)
        for ours, peer in (("flexh2o-mem", "hf-mem"), ("flexh2o-disk", "acc-disk")):
            if ours in best and peer in best:
                ratio = best[ours] / best[peer] if best[peer] > 0 else float("nan")
                rows.append((m, f"{a.prompt_len}+{a.gen_len}", a.seqs, ours, f"{best[ours]:.2f}",
                             peer, f"{best[peer]:.2f}", f"{ratio:.2f}"))
    head = ("model", "workload", "seqs", "flexh2o", "tok/s", "peer", "peer tok/s", "ratio")
    with open(a.csv, "w", newline="") as f:
        csv.writer(f).writerows([head] + rows)
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")

if __name__ == "__main__":
    main()
