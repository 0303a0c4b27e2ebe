#!/usr/bin/env python3
"""Writes the PyTorch checkpoint fixtures under tests/data/torch/ (developer tool, not run by CI).

Needs torch, safetensors and numpy (a venv: python3 -m venv /work/venvs/torch &&
/work/venvs/torch/bin/pip install torch safetensors numpy). Each model directory gets config.json,
its checkpoint as torch.save writes it (pytorch_model.bin, or HF-style shards with
pytorch_model.bin.index.json) and reference.safetensors: the same tensors, written by the
safetensors library, for a bit-for-bit comparison. bad/ holds checkpoints flexh2o must refuse,
malicious ones among them (each is checked here to really run its payload under torch.load).

  /work/venvs/torch/bin/python tests/tools/make_torch_checkpoints.py
"""
import collections
import io
import json
import os
import pickle
import shutil
import struct
import zipfile
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(__file__).resolve().parents[1] / "data" / "torch"
MARKER = "/tmp/flexh2o-torch-pwned"  # created by the malicious fixtures' payloads under torch.load

OPT = {
    "_name_or_path": "torch-opt-f16", "architectures": ["OPTForCausalLM"], "model_type": "opt",
    "vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
    "max_position_embeddings": 32, "word_embed_proj_dim": 32, "do_layer_norm_before": True,
    "_remove_final_layer_norm": False, "activation_function": "relu", "enable_bias": True,
    "layer_norm_elementwise_affine": True, "pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2,
    "tie_word_embeddings": True, "torch_dtype": "float16",
}
LLAMA = {
    "_name_or_path": "torch-llama", "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64,
    "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "attention_bias": False,
    "mlp_bias": False, "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
    "torch_dtype": "bfloat16",
}


def rand(*shape, dtype, center=0.0, amp=0.1):
    return (center + amp * (2 * torch.rand(*shape) - 1)).to(dtype)


def opt_state(c, dtype):
    H, V, F = c["hidden_size"], c["vocab_size"], c["ffn_dim"]
    sd = collections.OrderedDict()
    sd["model.decoder.embed_tokens.weight"] = rand(V, H, dtype=dtype)
    sd["model.decoder.embed_positions.weight"] = rand(c["max_position_embeddings"] + 2, H, dtype=dtype)
    for i in range(c["num_hidden_layers"]):
        p = f"model.decoder.layers.{i}."
        sd[p + "self_attn_layer_norm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
        sd[p + "self_attn_layer_norm.bias"] = rand(H, dtype=dtype, amp=0.01)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            sd[p + f"self_attn.{n}.weight"] = rand(H, H, dtype=dtype, amp=0.3)
            sd[p + f"self_attn.{n}.bias"] = rand(H, dtype=dtype, amp=0.01)
        sd[p + "final_layer_norm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
        sd[p + "final_layer_norm.bias"] = rand(H, dtype=dtype, amp=0.01)
        sd[p + "fc1.weight"] = rand(F, H, dtype=dtype, amp=0.3)
        sd[p + "fc1.bias"] = rand(F, dtype=dtype, amp=0.01)
        sd[p + "fc2.weight"] = rand(H, F, dtype=dtype, amp=0.3)
        sd[p + "fc2.bias"] = rand(H, dtype=dtype, amp=0.01)
    sd["model.decoder.final_layer_norm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
    sd["model.decoder.final_layer_norm.bias"] = rand(H, dtype=dtype, amp=0.01)
    # OPTForCausalLM.state_dict() lists the tied head: the same tensor, one storage.
    sd["lm_head.weight"] = sd["model.decoder.embed_tokens.weight"]
    # Module.state_dict() sets this attribute; pickling it adds a BUILD of the OrderedDict.
    sd._metadata = collections.OrderedDict([("", {"version": 1}), ("model.decoder", {"version": 1})])
    return sd


def llama_state(c, dtype, fused_qkv_layer=0):
    H, V, F = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    Q = c["num_attention_heads"] * c["head_dim"]
    KV = c["num_key_value_heads"] * c["head_dim"]
    sd = collections.OrderedDict()
    sd["model.embed_tokens.weight"] = rand(V, H, dtype=dtype)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
        if i == fused_qkv_layer:
            # q, k and v as row slices of one fused matrix: k and v have storage offsets.
            qkv = rand(Q + 2 * KV, H, dtype=dtype, amp=0.3)
            q, k, v = qkv.split([Q, KV, KV])
        else:
            q, k, v = rand(Q, H, dtype=dtype, amp=0.3), rand(KV, H, dtype=dtype, amp=0.3), rand(KV, H, dtype=dtype, amp=0.3)
        sd[p + "self_attn.q_proj.weight"] = q
        sd[p + "self_attn.k_proj.weight"] = k
        sd[p + "self_attn.v_proj.weight"] = v
        sd[p + "self_attn.o_proj.weight"] = rand(H, Q, dtype=dtype, amp=0.3)
        sd[p + "post_attention_layernorm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
        sd[p + "mlp.gate_proj.weight"] = rand(F, H, dtype=dtype, amp=0.3)
        sd[p + "mlp.up_proj.weight"] = rand(F, H, dtype=dtype, amp=0.3)
        sd[p + "mlp.down_proj.weight"] = rand(H, F, dtype=dtype, amp=0.3)
    sd["model.norm.weight"] = rand(H, dtype=dtype, center=1.0, amp=0.05)
    if c["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    else:
        sd["lm_head.weight"] = rand(V, H, dtype=dtype)
    return sd


def write_reference(d, sd):
    # The safetensors library refuses shared storage: every tensor gets its own copy.
    save_file({k: v.detach().clone().contiguous() for k, v in sd.items()}, str(d / "reference.safetensors"))


def new_dir(name, config=None):
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return d


def save_sharded(d, sd, max_shard_bytes):
    """Like transformers' shard_checkpoint: fill shards in state_dict order up to a byte budget."""
    shards, cur, size = [], collections.OrderedDict(), 0
    for k, v in sd.items():
        n = v.numel() * v.element_size()
        if cur and size + n > max_shard_bytes:
            shards.append(cur)
            cur, size = collections.OrderedDict(), 0
        cur[k] = v
        size += n
    shards.append(cur)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = f"pytorch_model-{i + 1:05d}-of-{len(shards):05d}.bin"
        torch.save(dict(shard), d / name)  # transformers saves each shard as a plain dict
        for k, v in shard.items():
            weight_map[k] = name
            total += v.numel() * v.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (d / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return len(shards)


def zip_records(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def write_zip(path, records, zip64=False, method=0, align=64):
    """A minimal zip writer: torch's layout (data 64-byte aligned by a padding extra field), with the
    ZIP64 records torch's writer emits for checkpoints above 4 GiB when zip64 is set."""
    out, central = bytearray(), bytearray()
    for name, data in records:
        nb = name.encode()
        crc = zlib.crc32(data)
        if method == 8:
            c = zlib.compressobj(9, zlib.DEFLATED, -15)
            payload = c.compress(data) + c.flush()
        else:
            payload = data
        off = len(out)
        pad = (-(off + 30 + len(nb) + 4)) % align
        extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45 if zip64 else 20, 0, method, 0, 0x21, crc,
                           len(payload), len(data), len(nb), len(extra)) + nb + extra + payload
        if zip64:
            cextra = struct.pack("<HHQQQ", 1, 24, len(data), len(payload), off)
            csz = usz = lho = 0xFFFFFFFF
        else:
            cextra, csz, usz, lho = b"", len(payload), len(data), off
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45 if zip64 else 20, 0, method, 0, 0x21, crc,
                               csz, usz, len(nb), len(cextra), 0, 0, 0, 0, lho) + nb + cextra
    cd_off, n = len(out), len(records)
    out += central
    if zip64:
        z64 = len(out)
        out += struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_off)
        out += struct.pack("<IIQI", 0x07064B50, 0, z64, 1)
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    else:
        out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, n, n, len(central), cd_off, 0)
    Path(path).write_bytes(bytes(out))


def replace_record(records, suffix, data):
    return [(n, data if n.endswith(suffix) else d) for n, d in records]


# ---- payloads: objects whose unpickling runs code ---------------------------------------------

class SystemCall:
    def __reduce__(self):
        return (os.system, (f"touch {MARKER}",))


class EvalCall:
    def __reduce__(self):
        return (eval, (f"__import__('os').system('touch {MARKER}')",))


class DottedImport:
    """torch._utils._import_dotted_name is in a module the reader allows, but it imports anything."""
    def __reduce__(self):
        import torch._utils
        return (torch._utils._import_dotted_name, ("os.getcwd",))


class FakeStorage:
    def __init__(self, cls, key, numel):
        self.cls, self.key, self.numel = cls, key, numel


class FakeTensor:
    """Pickles like a tensor, with storage, offset, size and stride chosen freely."""
    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2, self.args)


class FakePickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            return ("storage", obj.cls, obj.key, "cpu", obj.numel)
        return None


def fake_checkpoint(path, state, storages):
    """A zip laid out as torch.save's, with a pickle of FakeTensors and the given storage bytes."""
    buf = io.BytesIO()
    FakePickler(buf, protocol=2).dump(state)
    recs = [("archive/data.pkl", buf.getvalue()), ("archive/byteorder", b"little")]
    recs += [(f"archive/data/{k}", v) for k, v in storages.items()]
    recs += [("archive/version", b"3\n")]
    write_zip(path, recs)


def check_payload_runs(path):
    if os.path.exists(MARKER):
        os.remove(MARKER)
    try:
        torch.load(path, weights_only=False)
    except Exception:
        pass
    assert os.path.exists(MARKER), f"{path}: the payload did not run under torch.load"
    os.remove(MARKER)


def main():
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)

    # OPT, f16, one file, tied head sharing the embedding's storage (torch.save of a state_dict).
    d = new_dir("opt-f16", OPT)
    sd = opt_state(OPT, torch.float16)
    torch.save(sd, d / "pytorch_model.bin")
    write_reference(d, sd)

    # LLaMA, bf16, untied, HF-style shards; q/k/v of layer 0 slice one fused storage.
    d = new_dir("llama-bf16-sharded", LLAMA)
    sd = llama_state(LLAMA, torch.bfloat16)
    n = save_sharded(d, sd, max_shard_bytes=20000)
    assert n >= 3, n
    write_reference(d, sd)

    # LLaMA, f32, tied head, nn.Parameters (torch._utils._rebuild_parameter), pickle protocol 4
    # (SHORT_BINUNICODE, MEMOIZE, FRAME, STACK_GLOBAL).
    c = dict(LLAMA, _name_or_path="torch-llama-f32", tie_word_embeddings=True, torch_dtype="float32")
    d = new_dir("llama-f32", c)
    sd = llama_state(c, torch.float32)
    params = {k: torch.nn.Parameter(v, requires_grad=False) for k, v in sd.items() if k != "lm_head.weight"}
    params["lm_head.weight"] = params["model.embed_tokens.weight"]
    torch.save(params, d / "pytorch_model.bin", pickle_protocol=4)
    write_reference(d, sd)

    # Odd tensors: 0-d, empty, integer dtypes, slices with storage offsets (1-D and rows of a
    # matrix), one tensor under two names; then the same records re-zipped with ZIP64 records.
    d = new_dir("misc")
    big = torch.arange(40, dtype=torch.float32) * 0.5
    mat = rand(6, 5, dtype=torch.float16)
    misc = collections.OrderedDict()
    misc["scalar"] = torch.tensor(3.25, dtype=torch.float32)
    misc["empty"] = torch.zeros(0, 4, dtype=torch.float16)
    misc["ids"] = torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4)
    misc["counts"] = torch.tensor([7, -1, 65536], dtype=torch.int32)
    misc["bytes"] = torch.arange(250, 256, dtype=torch.uint8)
    misc["big"] = big
    misc["slice"] = big[13:21]
    misc["rows"] = mat[2:5]
    misc["mat"] = mat
    misc["alias"] = misc["mat"]
    misc["bf"] = rand(3, 2, 2, 2, dtype=torch.bfloat16)
    torch.save(misc, d / "pytorch_model.bin")
    write_reference(d, misc)
    write_zip(d / "zip64.bin", zip_records(d / "pytorch_model.bin"), zip64=True)
    got = torch.load(d / "zip64.bin", weights_only=True)
    assert all(torch.equal(got[k], v) for k, v in misc.items())

    # Refused checkpoints.
    b = new_dir("bad")
    small = {"w": torch.arange(6, dtype=torch.float16).reshape(2, 3)}
    torch.save(small, b / "good.bin")
    good = (b / "good.bin").read_bytes()
    recs = zip_records(b / "good.bin")
    torch.save(small, b / "legacy.bin", _use_new_zipfile_serialization=False)
    write_zip(b / "compressed.bin", recs, method=8)
    write_zip(b / "bigendian.bin", replace_record(recs, "/byteorder", b"big"))
    # Encryption flag (bit 0) in the central header of the first entry.
    enc = bytearray(good)
    cd = enc.find(b"PK\x01\x02")
    enc[cd + 8] |= 1
    (b / "encrypted.bin").write_bytes(bytes(enc))
    (b / "truncated.bin").write_bytes(good[: len(good) // 2])
    # The data/0 record's local header offset moved past the end of the file.
    past = bytearray(good)
    i = past.find(b"PK\x01\x02")
    while past[i + 46:i + 46 + struct.unpack_from("<H", past, i + 28)[0]] != b"good/data/0":
        i = past.find(b"PK\x01\x02", i + 4)
    struct.pack_into("<I", past, i + 42, len(good) + 1000)
    (b / "past_eof.bin").write_bytes(bytes(past))
    # The same record claiming 0xfffffffe bytes.
    huge = bytearray(good)
    struct.pack_into("<II", huge, i + 20, 0xFFFFFFFE, 0xFFFFFFFE)
    (b / "huge_size.bin").write_bytes(bytes(huge))
    torch.save({"w": torch.arange(6, dtype=torch.float16).reshape(2, 3).t()}, b / "noncontiguous.bin")
    torch.save({"w": torch.zeros(3, dtype=torch.float64)}, b / "double.bin")
    torch.save({"w": small["w"], "x": SystemCall()}, b / "os_system.bin")
    torch.save({"w": small["w"], "x": EvalCall()}, b / "eval.bin")
    torch.save({"w": small["w"], "x": DottedImport()}, b / "dotted_import.bin")
    for f in ("os_system.bin", "eval.bin"):
        check_payload_runs(b / f)
    # An opcode torch.save never writes (0xff is no opcode at all), replacing the pickle.
    write_zip(b / "unknown_opcode.bin", replace_record(recs, "/data.pkl", b"\x80\x02}q\x00\xff."))
    write_zip(b / "inst_opcode.bin", replace_record(recs, "/data.pkl", b"\x80\x02(iposix\nsystem\n."))
    # A storage claiming 2**40 elements for an 8-byte record, and a tensor reaching past its storage.
    fake_checkpoint(b / "huge_numel.bin", {"w": FakeTensor(FakeStorage(torch.HalfStorage, "0", 1 << 40), 0, (4,), (1,))},
                    {"0": b"\0" * 8})
    fake_checkpoint(b / "past_storage.bin", {"w": FakeTensor(FakeStorage(torch.HalfStorage, "0", 4), 2, (3,), (1,))},
                    {"0": b"\0" * 8})
    fake_checkpoint(b / "fake_ok.bin", {"w": FakeTensor(FakeStorage(torch.HalfStorage, "0", 4), 1, (3,), (1,))},
                    {"0": struct.pack("<4H", 1, 2, 3, 4)})
    assert torch.equal(torch.load(b / "fake_ok.bin", weights_only=True)["w"].view(torch.int16),
                       torch.tensor([2, 3, 4], dtype=torch.int16))
    os.remove(b / "good.bin")
    total = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
