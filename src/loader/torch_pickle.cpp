// The restricted unpickler. Values live in one arena (a vector) and refer to each other by
// index, so shared and even cyclic references (the memo allows both) need no ownership, nothing
// recurses, and destruction is flat. Every opcode that builds something is bounded: values,
// container items, memo slots, stack depth and mark depth each have a cap far above what a
// real checkpoint uses (a 1000-tensor state dict makes ~30k values). Calls are emulated:
// _rebuild_tensor_v2 records storage, offset, shape and stride; OrderedDict makes a dict.
#include "loader/torch_pickle.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <unordered_set>

#include "core/error.h"

namespace flexh2o {
namespace {

constexpr size_t kMaxValues = size_t(1) << 22;
constexpr size_t kMaxItems = size_t(1) << 24;  // elements of all containers together
constexpr size_t kMaxStack = size_t(1) << 20;
constexpr size_t kMaxMarks = 64;
constexpr uint64_t kMaxMemo = uint64_t(1) << 22;
constexpr size_t kMaxNameBytes = 1024;
constexpr uint32_t kUnset = std::numeric_limits<uint32_t>::max();

enum class Kind : uint8_t { kNone, kBool, kInt, kFloat, kStr, kTuple, kList, kDict, kGlobal, kStorage, kTensor };

enum class Callable : uint8_t {
  kOrderedDict,
  kRebuildTensorV2,
  kRebuildTensor,
  kRebuildParameter,
  kRebuildParameterWithState,
  kRebuildFromTypeV2,
  kTensorType,
  kStorageClass,
};

struct Value {
  Kind kind = Kind::kNone;
  int64_t i = 0;       // kBool, kInt; kGlobal: Callable; kStorage, kTensor: index into the result lists
  uint32_t aux = 0;    // kGlobal of a storage class: index into kStorageClasses
  std::string s;       // kStr; kGlobal: "module.name"
  std::vector<uint32_t> items;  // kTuple, kList: elements; kDict: key, value, key, value, ...
};

struct StorageClass {
  const char* name;
  std::optional<DType> dtype;
};
// The typed storages torch.save names in persistent ids (torch/storage.py _LegacyStorage subclasses).
const StorageClass kStorageClasses[] = {
    {"HalfStorage", DType::F16},     {"FloatStorage", DType::F32},    {"BFloat16Storage", DType::BF16},
    {"IntStorage", DType::I32},      {"LongStorage", DType::I64},     {"ByteStorage", DType::U8},
    {"DoubleStorage", std::nullopt}, {"CharStorage", std::nullopt},   {"ShortStorage", std::nullopt},
    {"BoolStorage", std::nullopt},   {"ComplexFloatStorage", std::nullopt}, {"ComplexDoubleStorage", std::nullopt},
    {"QInt8Storage", std::nullopt},  {"QUInt8Storage", std::nullopt}, {"QInt32Storage", std::nullopt},
};

struct GlobalDef {
  std::string_view module, name;
  Callable callable;
};
const GlobalDef kGlobals[] = {
    {"collections", "OrderedDict", Callable::kOrderedDict},
    {"torch._utils", "_rebuild_tensor_v2", Callable::kRebuildTensorV2},
    {"torch._utils", "_rebuild_tensor", Callable::kRebuildTensor},
    {"torch._utils", "_rebuild_parameter", Callable::kRebuildParameter},
    {"torch._utils", "_rebuild_parameter_with_state", Callable::kRebuildParameterWithState},
    {"torch._tensor", "_rebuild_from_type_v2", Callable::kRebuildFromTypeV2},
    {"torch", "Tensor", Callable::kTensorType},
    {"torch._tensor", "Tensor", Callable::kTensorType},
    {"torch.nn.parameter", "Parameter", Callable::kTensorType},
};

// Names of the pickle opcodes torch.save never writes, for the refusal message.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case 'i': return "INST";
    case 'o': return "OBJ";
    case 0x81: return "NEWOBJ";
    case 0x92: return "NEWOBJ_EX";
    case 0x82: case 0x83: case 0x84: return "EXT";
    case 'P': return "PERSID";
    case 'I': return "INT";
    case 'L': return "LONG";
    case 0x8b: return "LONG4";
    case 'S': return "STRING";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'V': return "UNICODE";
    case 'F': return "FLOAT";
    case 'g': return "GET";
    case 'p': return "PUT";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8e: return "BINBYTES8";
    case 0x96: return "BYTEARRAY8";
    case 0x97: return "NEXT_BUFFER";
    case 0x98: return "READONLY_BUFFER";
    case 0x8f: return "EMPTY_SET";
    case 0x90: return "ADDITEMS";
    case 0x91: return "FROZENSET";
    default: return "unknown";
  }
}

// Text from the file, made safe to print.
std::string shown(std::string_view s, size_t max = 120) {
  std::string out;
  for (char c : s.substr(0, max)) out += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  return s.size() > max ? out + "..." : out;
}

class Unpickler {
 public:
  Unpickler(std::string_view pkl, const std::string& where) : p_(pkl), where_(where) {}

  PickledCheckpoint run() {
    while (pos_ < p_.size()) {
      at_ = pos_;
      const uint8_t op = u8();
      if (op == '.') return result(pop());
      step(op);
    }
    fail("the pickle ends without a STOP opcode (the file is truncated or corrupt)");
  }

 private:
  template <typename... A>
  [[noreturn]] void fail(const A&... a) const {
    FH_FAIL(where_, ", byte ", at_, ": ", a...);
  }

  // ---- input -----------------------------------------------------------------------------
  std::string_view take(uint64_t n) {
    if (n > p_.size() - pos_) fail("an opcode needs ", n, " more bytes but only ", p_.size() - pos_, " remain (truncated?)");
    std::string_view s = p_.substr(pos_, size_t(n));
    pos_ += size_t(n);
    return s;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  uint64_t le(int w) {
    const std::string_view s = take(uint64_t(w));
    uint64_t v = 0;
    for (int i = w - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(s[size_t(i)]);
    return v;
  }
  std::string_view line() {
    const size_t nl = p_.find('\n', pos_);
    if (nl == std::string_view::npos || nl - pos_ > 256) fail("GLOBAL has no module/name line of at most 256 bytes");
    const std::string_view s = p_.substr(pos_, nl - pos_);
    pos_ = nl + 1;
    return s;
  }

  // ---- values and stack ------------------------------------------------------------------
  uint32_t make(Value v) {
    if (values_.size() >= kMaxValues) fail("the pickle builds more than ", kMaxValues, " values; no checkpoint does");
    items_ += v.items.size();
    if (items_ > kMaxItems) fail("the pickle's containers hold more than ", kMaxItems, " items; no checkpoint does");
    values_.push_back(std::move(v));
    return uint32_t(values_.size() - 1);
  }
  void push(uint32_t v) {
    if (stack_.size() >= kMaxStack) fail("the pickle stack grows past ", kMaxStack, " entries");
    stack_.push_back(v);
  }
  size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t pop() {
    if (stack_.size() <= floor()) fail("an opcode pops from an empty stack (or across a MARK)");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t top() {
    if (stack_.size() <= floor()) fail("an opcode needs a value but the stack is empty");
    return stack_.back();
  }
  std::vector<uint32_t> pop_mark() {
    if (marks_.empty()) fail("an opcode needs a MARK but none is open");
    std::vector<uint32_t> items(stack_.begin() + std::ptrdiff_t(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  Value& val(uint32_t i) { return values_[i]; }
  void push_new(Kind k, int64_t i = 0) {
    Value v;
    v.kind = k;
    v.i = i;
    push(make(std::move(v)));
  }
  void push_container(Kind k, std::vector<uint32_t> items) {
    Value v;
    v.kind = k;
    v.items = std::move(items);
    push(make(std::move(v)));
  }
  Value& container(uint32_t i, Kind k, const char* op) {
    if (val(i).kind != k) fail(op, " applies to ", kind_name(val(i).kind), ", not ", kind_name(k));
    return val(i);
  }
  void add_items(Value& c, const std::vector<uint32_t>& items) {
    items_ += items.size();
    if (items_ > kMaxItems) fail("the pickle's containers hold more than ", kMaxItems, " items; no checkpoint does");
    c.items.insert(c.items.end(), items.begin(), items.end());
  }
  static const char* kind_name(Kind k) {
    const char* names[] = {"None",    "a bool",   "an int",   "a float",   "a str",   "a tuple",
                           "a list",  "a dict",   "a global", "a storage", "a tensor"};
    return names[int(k)];
  }
  void memo_put(uint64_t idx) {
    if (idx >= kMaxMemo) fail("memo index ", idx, " is above the limit of ", kMaxMemo);
    if (idx >= memo_.size()) memo_.resize(size_t(idx) + 1, kUnset);
    memo_[size_t(idx)] = top();
  }
  void memo_get(uint64_t idx) {
    if (idx >= memo_.size() || memo_[size_t(idx)] == kUnset) fail("memo index ", idx, " is read before it is written");
    push(memo_[size_t(idx)]);
  }
  int64_t as_int(uint32_t i, const char* what) {
    if (val(i).kind != Kind::kInt) fail(what, " is ", kind_name(val(i).kind), ", not an int");
    return val(i).i;
  }
  const std::string& as_str(uint32_t i, const char* what) {
    if (val(i).kind != Kind::kStr) fail(what, " is ", kind_name(val(i).kind), ", not a str");
    return val(i).s;
  }

  // ---- opcodes ---------------------------------------------------------------------------
  void step(uint8_t op) {
    switch (op) {
      case 0x80: {  // PROTO
        const uint8_t v = u8();
        if (v < 2 || v > 5) fail("pickle protocol ", int(v), " is not one torch.save writes (2 to 5)");
        return;
      }
      case 0x95: return check_frame(le(8));  // FRAME: a length hint only
      case '(':  // MARK
        if (marks_.size() >= kMaxMarks) fail("MARKs nest deeper than ", kMaxMarks);
        marks_.push_back(stack_.size());
        return;
      case 'N': return push_new(Kind::kNone);
      case 0x88: return push_new(Kind::kBool, 1);  // NEWTRUE
      case 0x89: return push_new(Kind::kBool, 0);  // NEWFALSE
      case 'J': return push_new(Kind::kInt, int64_t(int32_t(uint32_t(le(4)))));  // BININT
      case 'K': return push_new(Kind::kInt, int64_t(le(1)));                     // BININT1
      case 'M': return push_new(Kind::kInt, int64_t(le(2)));                     // BININT2
      case 0x8a: {                                                                // LONG1
        const uint8_t n = u8();
        if (n > 8) fail("LONG1 integer of ", int(n), " bytes does not fit in 64 bits");
        uint64_t v = n ? le(n) : 0;
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t(0) << (8 * n);  // sign-extend
        return push_new(Kind::kInt, int64_t(v));
      }
      case 'G':  // BINFLOAT: floats appear only in metadata, which is not used
        take(8);
        return push_new(Kind::kFloat);
      case 'X': return push_str(take(le(4)));      // BINUNICODE
      case 0x8c: return push_str(take(le(1)));     // SHORT_BINUNICODE
      case 0x8d: return push_str(take(le(8)));     // BINUNICODE8
      case ')': return push_container(Kind::kTuple, {});
      case ']': return push_container(Kind::kList, {});
      case '}': return push_container(Kind::kDict, {});
      case 't': return push_container(Kind::kTuple, pop_mark());
      case 'l': return push_container(Kind::kList, pop_mark());
      case 'd': {
        std::vector<uint32_t> items = pop_mark();
        if (items.size() % 2) fail("DICT has an odd number of items");
        return push_container(Kind::kDict, std::move(items));
      }
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        std::vector<uint32_t> items(size_t(op - 0x84));
        for (size_t k = items.size(); k-- > 0;) items[k] = pop();
        return push_container(Kind::kTuple, std::move(items));
      }
      case 'a': {  // APPEND
        const uint32_t v = pop();
        return add_items(container(top(), Kind::kList, "APPEND"), {v});
      }
      case 'e': {  // APPENDS
        const std::vector<uint32_t> items = pop_mark();
        return add_items(container(top(), Kind::kList, "APPENDS"), items);
      }
      case 's': {  // SETITEM
        const uint32_t v = pop(), k = pop();
        return add_items(container(top(), Kind::kDict, "SETITEM"), {k, v});
      }
      case 'u': {  // SETITEMS
        const std::vector<uint32_t> items = pop_mark();
        if (items.size() % 2) fail("SETITEMS has an odd number of items");
        return add_items(container(top(), Kind::kDict, "SETITEMS"), items);
      }
      case 'q': return memo_put(le(1));             // BINPUT
      case 'r': return memo_put(le(4));             // LONG_BINPUT
      case 0x94: return memo_put(memo_.size());     // MEMOIZE
      case 'h': return memo_get(le(1));             // BINGET
      case 'j': return memo_get(le(4));             // LONG_BINGET
      case 'c': {                                   // GLOBAL
        const std::string module(line());
        const std::string name(line());
        return push_global(module, name);
      }
      case 0x93: {  // STACK_GLOBAL
        const uint32_t n = pop(), m = pop();
        return push_global(as_str(m, "the STACK_GLOBAL module"), as_str(n, "the STACK_GLOBAL name"));
      }
      case 'R': {  // REDUCE
        const uint32_t args = pop(), fn = pop();
        return push(call(fn, args, false));
      }
      case 'Q': return push(persistent_id(pop()));  // BINPERSID
      case 'b': {                                   // BUILD: the state of an OrderedDict (_metadata) is not needed
        (void)pop();
        const Kind k = val(top()).kind;
        if (k != Kind::kDict && k != Kind::kTensor)
          fail("BUILD sets the state of ", kind_name(k), "; torch.save builds only dicts and tensors");
        return;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        const std::string ch = op >= 0x21 && op < 0x7f ? std::string(" '") + char(op) + "'" : std::string();
        fail("opcode ", hex, ch, " (", opcode_name(op), ") is not one torch.save writes; refusing to read further");
      }
    }
  }
  void check_frame(uint64_t n) {
    if (n > p_.size() - pos_) fail("FRAME of ", n, " bytes runs past the end of the pickle");
  }
  void push_str(std::string_view s) {
    Value v;
    v.kind = Kind::kStr;
    v.s = std::string(s);
    push(make(std::move(v)));
  }

  void push_global(const std::string& module, const std::string& name) {
    Value v;
    v.kind = Kind::kGlobal;
    v.s = module + "." + name;
    bool ok = false;
    if (module == "torch") {
      for (uint32_t k = 0; k < std::size(kStorageClasses); ++k)
        if (name == kStorageClasses[k].name) v.i = int64_t(Callable::kStorageClass), v.aux = k, ok = true;
    }
    for (const GlobalDef& g : kGlobals)
      if (module == g.module && name == g.name) v.i = int64_t(g.callable), ok = true;
    if (!ok)
      fail("the pickle refers to the global ", shown(module), ".", shown(name),
           ", which is not one torch uses to rebuild tensors; refusing to load it (torch.load without "
           "weights_only would import and call it)");
    push(make(std::move(v)));
  }

  // ('storage', torch.<cls>, key, location, numel)
  uint32_t persistent_id(uint32_t pid) {
    const Value& t = val(pid);
    if (t.kind != Kind::kTuple || t.items.size() != 5 || val(t.items[0]).kind != Kind::kStr ||
        val(t.items[0]).s != "storage")
      fail("a persistent id is not a ('storage', class, key, location, numel) tuple");
    const Value& cls = val(t.items[1]);
    if (cls.kind != Kind::kGlobal || Callable(cls.i) != Callable::kStorageClass)
      fail("a persistent id names ", cls.kind == Kind::kGlobal ? shown(cls.s) : std::string(kind_name(cls.kind)),
           " where a torch storage class belongs");
    const std::string key = as_str(t.items[2], "a storage key");
    (void)as_str(t.items[3], "a storage location");
    const int64_t numel = as_int(t.items[4], "a storage size");
    if (key.empty() || key.size() > 64 ||
        key.find_first_not_of("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_") != std::string::npos)
      fail("storage key \"", shown(key, 64), "\" is not a short alphanumeric record name");
    if (numel < 0) fail("storage ", key, " has a negative size ", numel);
    const StorageClass& sc = kStorageClasses[cls.aux];
    auto [it, fresh] = storage_keys_.emplace(key, out_.storages.size());
    if (fresh) {
      out_.storages.push_back({sc.name, sc.dtype, key, numel});
    } else {
      const PickledStorage& s = out_.storages[it->second];
      if (s.cls != sc.name || s.numel != numel)
        fail("storage ", key, " is referenced as ", s.cls, " of ", s.numel, " elements and as ", sc.name, " of ",
             numel, " elements");
    }
    Value v;
    v.kind = Kind::kStorage;
    v.i = int64_t(it->second);
    return make(std::move(v));
  }

  uint32_t call(uint32_t fn, uint32_t args_idx, bool nested) {
    const Value& f = val(fn);
    if (f.kind != Kind::kGlobal) fail("REDUCE calls ", kind_name(f.kind), ", not a global");
    if (val(args_idx).kind != Kind::kTuple)
      fail("REDUCE passes ", shown(f.s), " ", kind_name(val(args_idx).kind), ", not an argument tuple");
    const std::vector<uint32_t> a = val(args_idx).items;
    const std::string name = f.s;
    auto want = [&](bool ok) {
      if (!ok) fail(name, " is called with ", a.size(), " arguments of a shape torch.save never writes");
    };
    switch (Callable(f.i)) {
      case Callable::kOrderedDict:
        want(a.empty());
        return make(Value{Kind::kDict, 0, 0, {}, {}});
      case Callable::kRebuildTensorV2:
        want(a.size() == 6 || a.size() == 7);
        return tensor(a);
      case Callable::kRebuildTensor:
        want(a.size() == 4);
        return tensor(a);
      case Callable::kRebuildParameter:
      case Callable::kRebuildParameterWithState:
        want(a.size() == (Callable(f.i) == Callable::kRebuildParameter ? 3u : 4u) && val(a[0]).kind == Kind::kTensor);
        return a[0];
      case Callable::kRebuildFromTypeV2: {
        // (func, type, args, state): func(*args) converted to `type`; only tensor types qualify.
        want(a.size() == 4 && !nested && val(a[0]).kind == Kind::kGlobal && val(a[1]).kind == Kind::kGlobal &&
             Callable(val(a[1]).i) == Callable::kTensorType);
        const Callable inner = Callable(val(a[0]).i);
        want(inner != Callable::kOrderedDict && inner != Callable::kRebuildFromTypeV2 && inner != Callable::kTensorType &&
             inner != Callable::kStorageClass);
        return call(a[0], a[2], true);
      }
      case Callable::kTensorType:
      case Callable::kStorageClass:
        break;
    }
    fail("the pickle calls ", name, ", which torch.save never calls while loading");
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  uint32_t tensor(const std::vector<uint32_t>& a) {
    if (val(a[0]).kind != Kind::kStorage) fail("a tensor is rebuilt from ", kind_name(val(a[0]).kind), ", not a storage");
    PickledTensor t;
    t.storage = size_t(val(a[0]).i);
    t.offset = as_int(a[1], "a tensor's storage offset");
    if (t.offset < 0) fail("a tensor has a negative storage offset ", t.offset);
    const Value& size = val(a[2]);
    const Value& stride = val(a[3]);
    if (size.kind != Kind::kTuple || stride.kind != Kind::kTuple || size.items.size() != stride.items.size())
      fail("a tensor's size and stride are not tuples of one length");
    if (size.items.size() > size_t(kMaxDims))
      fail("a tensor has rank ", size.items.size(), "; at most ", kMaxDims, " dimensions are supported");
    for (size_t d = 0; d < size.items.size(); ++d) {
      const int64_t n = as_int(size.items[d], "a tensor dimension"), s = as_int(stride.items[d], "a tensor stride");
      if (n < 0 || s < 0) fail("a tensor has a negative size or stride (", n, ", ", s, ")");
      t.shape.dims[size_t(t.shape.ndim++)] = n;
      t.stride[d] = s;
    }
    tensors_.push_back(std::move(t));
    return make(Value{Kind::kTensor, int64_t(tensors_.size() - 1), 0, {}, {}});
  }

  PickledCheckpoint result(uint32_t root) {
    const Value& d = val(root);
    if (d.kind != Kind::kDict)
      fail("the checkpoint is ", kind_name(d.kind), ", not a dict of tensors (a state_dict saved with torch.save)");
    std::unordered_set<std::string_view> seen;
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const std::string& name = as_str(d.items[k], "a state_dict key");
      if (name.size() > kMaxNameBytes ||
          std::any_of(name.begin(), name.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20; }))
        fail("a tensor name has control characters or over ", kMaxNameBytes, " bytes: \"", shown(name), "\"");
      const Value& v = val(d.items[k + 1]);
      if (v.kind != Kind::kTensor)
        fail("state_dict entry \"", shown(name), "\" is ", kind_name(v.kind), ", not a tensor");
      if (!seen.insert(name).second) fail("tensor \"", shown(name), "\" appears twice in the state_dict");
      PickledTensor t = tensors_[size_t(v.i)];
      t.name = name;
      out_.tensors.push_back(std::move(t));
    }
    return std::move(out_);
  }

  std::string_view p_;
  const std::string& where_;
  size_t pos_ = 0, at_ = 0;
  std::vector<Value> values_;
  size_t items_ = 0;
  std::vector<uint32_t> stack_, memo_;
  std::vector<size_t> marks_;
  std::vector<PickledTensor> tensors_;
  std::map<std::string, size_t> storage_keys_;
  PickledCheckpoint out_;
};

}  // namespace

PickledCheckpoint read_torch_pickle(std::string_view pkl, const std::string& where) {
  return Unpickler(pkl, where).run();
}

}  // namespace flexh2o
