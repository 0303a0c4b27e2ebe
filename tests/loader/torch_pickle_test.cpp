// read_torch_pickle on hand-assembled pickles: what torch.save writes is read (including the
// _rebuild_from_type_v2 wrapper), and each opcode sequence a hostile file could use to escape
// the limits (memo, stack, marks, values, nesting, cycles) or the call list is refused with a
// message naming the pickle, the byte offset and the reason.
#include "loader/torch_pickle.h"

#include <gtest/gtest.h>

#include "loader/loader_test_util.h"

namespace flexh2o {
namespace {

using test::error_of;
using namespace std::string_literals;

#define EXPECT_HAS(msg, part) EXPECT_NE((msg).find(part), std::string::npos) << (msg)

const std::string kWhere = "ckpt.bin: archive/data.pkl";

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}
std::string str(const std::string& s) { return "X" + le32(uint32_t(s.size())) + s; }
std::string global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }

// ('storage', torch.<cls>, key, 'cpu', numel) as a persistent id.
std::string storage(const std::string& cls, const std::string& key, int numel) {
  return "(" + str("storage") + global("torch", cls) + str(key) + str("cpu") + "K" + char(numel) + "tQ";
}
// The argument tuple of _rebuild_tensor_v2 for a 1-D tensor of `n` elements at `offset`.
std::string tensor_args(const std::string& storage_pid, int offset, int n) {
  return "(" + storage_pid + "K" + char(offset) + "K" + char(n) + "\x85" + "K\x01\x85" + "\x89" +
         global("collections", "OrderedDict") + ")Rt";
}
std::string rebuild(const std::string& args) { return global("torch._utils", "_rebuild_tensor_v2") + args + "R"; }
// {name: value, ...} followed by STOP.
std::string dict_of(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string p = "\x80\x02}q\x00("s;
  for (const auto& [k, v] : items) p += str(k) + v;
  return p + "u.";
}

PickledCheckpoint read(const std::string& p) { return read_torch_pickle(p, kWhere); }
std::string refusal(const std::string& p) {
  const std::string msg = error_of([&] { read(p); });
  EXPECT_HAS(msg, kWhere + ", byte ");
  return msg;
}

TEST(TorchPickle, ReadsATensorDict) {
  const PickledCheckpoint c = read(dict_of({{"w", rebuild(tensor_args(storage("HalfStorage", "0", 6), 2, 4))},
                                            {"b", rebuild(tensor_args(storage("HalfStorage", "0", 6), 0, 1))}}));
  ASSERT_EQ(c.storages.size(), 1u);  // the key is shared
  EXPECT_EQ(c.storages[0].cls, "HalfStorage");
  EXPECT_EQ(c.storages[0].dtype, DType::F16);
  EXPECT_EQ(c.storages[0].numel, 6);
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].name, "w");
  EXPECT_EQ(c.tensors[0].offset, 2);
  EXPECT_EQ(c.tensors[0].shape, Shape{4});
  EXPECT_EQ(c.tensors[0].stride[0], 1);
  EXPECT_EQ(c.tensors[1].name, "b");
}

TEST(TorchPickle, RebuildFromTypeAndParameterWrappers) {
  const std::string t = rebuild(tensor_args(storage("FloatStorage", "7", 4), 0, 4));
  const std::string from_type = global("torch._tensor", "_rebuild_from_type_v2") + "(" +
                                global("torch._utils", "_rebuild_tensor_v2") + global("torch", "Tensor") +
                                tensor_args(storage("FloatStorage", "7", 4), 0, 4) + "}tR";
  const std::string param = global("torch._utils", "_rebuild_parameter") + "(" + t + "\x89" +
                            global("collections", "OrderedDict") + ")RtR";
  const PickledCheckpoint c = read(dict_of({{"a", from_type}, {"p", param}}));
  ASSERT_EQ(c.tensors.size(), 2u);
  EXPECT_EQ(c.tensors[0].shape, Shape{4});
  EXPECT_EQ(c.storages.at(0).dtype, DType::F32);
  // The wrapper may not wrap itself or call a non-rebuilder.
  const std::string bad = global("torch._tensor", "_rebuild_from_type_v2") + "(" + global("collections", "OrderedDict") +
                          global("torch", "Tensor") + ")}tR";
  EXPECT_HAS(refusal(dict_of({{"a", bad}})), "of a shape torch.save never writes");
}

TEST(TorchPickle, ForeignGlobalsAndCallsAreRefused) {
  EXPECT_HAS(refusal("\x80\x02" + global("os", "system") + "(" + str("true") + "tR."),
             "byte 2: the pickle refers to the global os.system");
  EXPECT_HAS(refusal("\x80\x02" + global("torch", "load") + "."), "the global torch.load");
  EXPECT_HAS(refusal("\x80\x02" + str("builtins") + str("exec") + "\x93."), "the global builtins.exec");
  // Allowed globals called in ways torch never does.
  EXPECT_HAS(refusal("\x80\x02" + global("torch", "HalfStorage") + ")R."),
             "calls torch.HalfStorage, which torch.save never calls");
  EXPECT_HAS(refusal("\x80\x02" + global("collections", "OrderedDict") + "(K\x01tR."),
             "collections.OrderedDict is called with 1 arguments");
  EXPECT_HAS(refusal("\x80\x02K\x01)R."), "REDUCE calls an int, not a global");
  EXPECT_HAS(refusal("\x80\x02" + global("torch._utils", "_rebuild_tensor_v2") + "(K\x01K\x00)"s + ")\x89" + "NtR."),
             "a tensor is rebuilt from an int, not a storage");
  EXPECT_HAS(refusal("\x80\x02" + global("torch", "Tensor") + "}b."), "BUILD sets the state of a global");
  EXPECT_HAS(refusal("\x80\x02(" + str("storage") + global("collections", "OrderedDict") + str("0") + str("cpu") + "K\x01tQ."),
             "names collections.OrderedDict where a torch storage class belongs");
  EXPECT_HAS(refusal("\x80\x02" + storage("HalfStorage", "../x", 1) + "."), "is not a short alphanumeric record name");
  EXPECT_HAS(refusal("\x80\x02" + storage("HalfStorage", "0", 1) + storage("FloatStorage", "0", 1) + "."),
             "storage 0 is referenced as HalfStorage of 1 elements and as FloatStorage of 1 elements");
}

TEST(TorchPickle, OpcodesOutsideTheListAreRefused) {
  EXPECT_HAS(refusal("\x80\x02}\xff."), "byte 3: opcode 0xff (unknown) is not one torch.save writes");
  EXPECT_HAS(refusal("\x80\x02(iposix\nsystem\n."), "opcode 0x69 'i' (INST)");
  EXPECT_HAS(refusal("\x80\x02(cposix\nsystem\no."), "the global posix.system");
  EXPECT_HAS(refusal("\x80\x02N\x81."), "opcode 0x81 (NEWOBJ)");
  EXPECT_HAS(refusal("\x80\x02N2."), "opcode 0x32 '2' (DUP)");
  EXPECT_HAS(refusal("\x80\x06}."), "pickle protocol 6 is not one torch.save writes");
}

TEST(TorchPickle, MalformedStructureIsRefused) {
  EXPECT_HAS(refusal("\x80\x02}"), "ends without a STOP opcode");
  EXPECT_HAS(refusal("\x80\x02X\xff\x00\x00\x00" "ab."s), "needs 255 more bytes but only 3 remain");
  EXPECT_HAS(refusal("\x80\x02h\x05."), "memo index 5 is read before it is written");
  EXPECT_HAS(refusal("\x80\x02}r\xff\xff\xff\xff."), "memo index 4294967295 is above the limit");
  EXPECT_HAS(refusal("\x80\x02R."), "pops from an empty stack");
  EXPECT_HAS(refusal("\x80\x02N(R."), "pops from an empty stack (or across a MARK)");
  EXPECT_HAS(refusal("\x80\x02t."), "needs a MARK but none is open");
  EXPECT_HAS(refusal("\x80\x02\x8a\x09" + std::string(9, '\x01') + "."), "LONG1 integer of 9 bytes");
  EXPECT_HAS(refusal("\x80\x02]."), "the checkpoint is a list, not a dict of tensors");
  EXPECT_HAS(refusal(dict_of({{"step", "K\x07"}})), "state_dict entry \"step\" is an int, not a tensor");
  EXPECT_HAS(refusal("\x80\x02}(K\x01NK\x02Nu."), "a state_dict key is an int, not a str");
  const std::string t = rebuild(tensor_args(storage("HalfStorage", "0", 4), 0, 4));
  EXPECT_HAS(refusal(dict_of({{"w", t}, {"w", t}})), "tensor \"w\" appears twice");
  EXPECT_HAS(refusal(dict_of({{"a\nb", t}})), "a tensor name has control characters");
  EXPECT_HAS(refusal("\x80\x02]K\x01K\x02s."), "SETITEM applies to a list, not a dict");
  // Rank 5 (kMaxDims is 4).
  const std::string rank5 = global("torch._utils", "_rebuild_tensor_v2") + "(" + storage("HalfStorage", "0", 1) +
                            "K\x00(K\x01K\x01K\x01K\x01K\x01t(K\x01K\x01K\x01K\x01K\x01t\x89NtR"s;
  EXPECT_HAS(refusal(dict_of({{"w", rank5}})), "a tensor has rank 5; at most 4 dimensions");
  const std::string negative = global("torch._utils", "_rebuild_tensor_v2") + "(" + storage("HalfStorage", "0", 1) +
                               "J\xff\xff\xff\xff" + "K\x01\x85K\x01\x85\x89NtR";
  EXPECT_HAS(refusal(dict_of({{"w", negative}})), "negative storage offset -1");
}

TEST(TorchPickle, LimitsHoldAgainstBombs) {
  EXPECT_HAS(refusal("\x80\x02" + std::string(65, '(') + "."), "MARKs nest deeper than 64");
  EXPECT_HAS(refusal("\x80\x02" + std::string((size_t(1) << 20) + 1, 'N') + "."), "the pickle stack grows past");
  std::string values = "\x80\x02]";
  for (size_t i = 0; i < (size_t(1) << 22); ++i) values += "Na";
  EXPECT_HAS(refusal(values + "."), "builds more than 4194304 values");
  // A list holding itself 1000 times, and 100000 nested tuples: nothing recurses, nothing leaks.
  std::string cycle = "\x80\x02]q\x00"s;
  for (int i = 0; i < 1000; ++i) cycle += "h\x00"s "a";
  EXPECT_HAS(refusal(cycle + "."), "the checkpoint is a list");
  EXPECT_HAS(refusal("\x80\x02)" + std::string(100000, '\x85') + "."), "the checkpoint is a tuple");
}

}  // namespace
}  // namespace flexh2o
