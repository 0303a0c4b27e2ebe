"""peer_dryrun.py — developer check before a GPU window (not CI, not a measurement): runs a
FlexGen-family peer (PyPI flexgen, H2O's fork) on the CPU with its CUDA calls stubbed (streams,
events and pinning are no-ops, "cuda:0" tensors live on the host), so its whole code path runs
under this machine's torch/transformers and a break shows here instead of in the window.
  PYTHONPATH=<peer> peer_dryrun.py flexgen.flex_opt --model facebook/opt-125m --path _DUMMY_ ...
Its timings mean nothing."""
import contextlib, runpy, sys, torch

# Classes, not factories: transformers 5 writes `torch.cuda.Stream | None` in annotations.
class _Stream:
    def __init__(self, *a, **k): pass
    def synchronize(self): pass
    def wait_stream(self, s): pass
    def record_event(self, e=None): return _Event()
class _Event:
    def __init__(self, *a, **k): pass
    def record(self, s=None): pass
    def synchronize(self): pass
    def wait(self, s=None): pass
    def elapsed_time(self, e): return 0.0
    def query(self): return True

c = torch.cuda
c.Stream = _Stream
c.Event = _Event
c.stream = lambda s: contextlib.nullcontext()
c.current_stream = lambda *a, **k: _Stream()
c.default_stream = lambda *a, **k: _Stream()
c.synchronize = lambda *a, **k: None
c.set_device = lambda *a, **k: None
c.empty_cache = lambda: None
c.memory_allocated = lambda *a, **k: 0
c.max_memory_allocated = lambda *a, **k: 0
c.reset_peak_memory_stats = lambda *a, **k: None
c.is_available = lambda: True
def _on_cpu(f):
    def g(*a, **k):
        k.pop("pin_memory", None)
        d = k.get("device")
        if d is not None and "cuda" in str(d):
            k["device"] = "cpu"
        return f(*a, **k)
    return g
for _name in ("empty", "zeros", "ones", "full", "arange", "rand", "randn", "tensor"):
    setattr(torch, _name, _on_cpu(getattr(torch, _name)))
torch.Tensor.pin_memory = lambda self, *a, **k: self
torch.Tensor.cuda = lambda self, *a, **k: self
torch.Tensor.is_pinned = lambda self, *a, **k: True
_device = torch.device

mod = sys.argv[1]
sys.argv = [mod] + sys.argv[2:]
pb = __import__(mod.rsplit(".", 1)[0] + ".pytorch_backend", fromlist=["x"])
_init = pb.TorchDevice.__init__
def init(self, name, *a, **k):
    _init(self, name, *a, **k)
    if name.startswith("cuda"):
        self.dev = _device("cpu")
pb.TorchDevice.__init__ = init
runpy.run_module(mod, run_name="__main__")
