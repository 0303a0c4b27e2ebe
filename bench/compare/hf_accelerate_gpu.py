"""hf_accelerate_gpu.py — Hugging Face transformers + accelerate device_map offloading on the
GPU with dummy weights, for bench/compare/gpu_compare.sh. GPU memory capped by max_memory and by
cap/sitecustomize.py (set_per_process_memory_fraction). Writes its result as JSON (tok/s by
FlexGen's rule, batch, lowest tier) for compare_table.py."""
import argparse, contextlib, json, time
import torch
from transformers import OPTConfig, OPTForCausalLM

SHAPES = {"opt-125m": (768, 12, 12, 3072), "opt-6.7b": (4096, 32, 32, 16384), "opt-30b": (7168, 48, 56, 28672)}


def dummy_model(name):
    """OPT of that shape in fp16 on the host, every weight 0.01 (FlexGen's _DUMMY_ is ones): a
    timing-only model without the random init (OPT-1.3B here, 2 cores: 14 s random, 5 s this)."""
    h, layers, heads, ffn = SHAPES[name]
    cfg = OPTConfig(hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads, ffn_dim=ffn,
                    word_embed_proj_dim=h, vocab_size=50272, max_position_embeddings=2048)
    try:
        from transformers.modeling_utils import no_init_weights
    except ImportError:
        no_init_weights = contextlib.nullcontext
    torch.set_default_dtype(torch.float16)
    with no_init_weights():
        model = OPTForCausalLM(cfg).eval()
    with torch.no_grad():
        for prm in model.parameters():
            prm.fill_(0.01)
    return model


def phase(t0, what):
    """A line per phase, so a run cut at its cap still says where its time went."""
    print(f"accelerate: {what} at {time.perf_counter() - t0:.1f} s", flush=True)


def main():
    t0 = time.perf_counter()
    from accelerate import infer_auto_device_map, dispatch_model
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="opt-6.7b")
    p.add_argument("--seqs", type=int, default=8)
    p.add_argument("--gpu-gib", type=int, default=16)
    p.add_argument("--result", required=True)
    a = p.parse_args()
    phase(t0, "imported")
    model = dummy_model(a.model)
    phase(t0, f"{a.model} built on the host")
    dmap = infer_auto_device_map(model, max_memory={0: f"{a.gpu_gib - 4}GiB", "cpu": "120GiB"},
                                 no_split_module_classes=["OPTDecoderLayer"])
    model = dispatch_model(model, device_map=dmap)
    phase(t0, f"dispatched ({sum(v == 'cpu' for v in dmap.values())} of {len(dmap)} modules on the host)")
    ids = torch.randint(4, 50000, (a.seqs, 512), generator=torch.Generator().manual_seed(0)).cuda()
    with torch.inference_mode():
        model.generate(ids[:, :32], max_new_tokens=1)  # warm-up
        torch.cuda.synchronize()
        phase(t0, "warmed up")
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=32, min_new_tokens=32)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t
    tok = (out.shape[1] - 512) * a.seqs / dt
    tier = "cpu" if "cpu" in set(dmap.values()) else "gpu"
    json.dump({"tok_s": tok, "batch": a.seqs, "tier": tier}, open(a.result, "w"))
    print(f"accelerate {a.model}: {tok:.2f} tok/s")


if __name__ == "__main__":
    main()
