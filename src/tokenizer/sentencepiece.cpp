// Checkpoints that ship only tokenizer.model (a sentencepiece ModelProto: Vicuna, OpenLLaMA, Yi):
// the protobuf is read here and turned into the tokenizer transformers 5 builds from it for
// LLaMA-family checkpoints (LlamaTokenizer: BPE over the pieces with merges derived from the
// vocabulary, byte fallback, Metaspace, the Replace/ByteFallback/Fuse/Strip decoder), as a
// tokenizer.json document that hf_json.cpp loads, so encoding runs through the one BPE pipeline.
#include <cstring>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_guard.h"
#include "tokenizer/detail/pipeline.h"
#include "tokenizer/detail/utf8.h"

namespace flexh2o::tok {

namespace {

using nlohmann::json;

// The largest tokenizer.model read: real ones are 0.5-5 MB (LLaMA 500 KB, Gemma 4 MB).
constexpr size_t kMaxModelBytes = size_t(64) << 20;
constexpr uint64_t kMaxMergeWork = uint64_t(1) << 30;
constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581, sentencepiece's visible space

// A bounded reader of the protobuf wire format over one message. Offsets in messages are
// absolute (base = where this message starts in the file).
class Wire {
 public:
  Wire(std::string_view bytes, const std::string& source, size_t base) : b_(bytes), source_(source), base_(base) {}
  bool done() const { return pos_ >= b_.size(); }

  uint64_t varint() {
    const size_t at = pos_;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= b_.size()) fail_at(at, "a varint runs past the end");
      const auto c = static_cast<unsigned char>(b_[pos_++]);
      v |= uint64_t(c & 0x7F) << shift;
      if (!(c & 0x80)) return v;
    }
    fail_at(at, "a varint is longer than 10 bytes");
  }
  // (field number, wire type) of the next field.
  std::pair<uint64_t, int> key() {
    const size_t at = pos_;
    const uint64_t k = varint();
    if (k >> 3 == 0) fail_at(at, "field number 0");
    return {k >> 3, int(k & 7)};
  }
  // A length-delimited field's bytes; `sub_base` is where they start in the file.
  std::string_view bytes(size_t* sub_base) {
    const uint64_t n = varint();
    if (n > b_.size() - pos_) fail("a field of " + std::to_string(n) + " bytes runs past the end");
    *sub_base = base_ + pos_;
    std::string_view s = b_.substr(pos_, size_t(n));
    pos_ += size_t(n);
    return s;
  }
  float fixed32_float() {
    if (b_.size() - pos_ < 4) fail("a 32-bit field runs past the end");
    uint32_t u = 0;
    for (int i = 0; i < 4; ++i) u |= uint32_t(static_cast<unsigned char>(b_[pos_ + size_t(i)])) << (8 * i);
    pos_ += 4;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  void skip(int wire) {
    size_t unused = 0;
    switch (wire) {
      case 0: (void)varint(); return;
      case 1: advance(8); return;
      case 2: (void)bytes(&unused); return;
      case 5: advance(4); return;
      default: fail("wire type " + std::to_string(wire) + " (groups or an unknown type)");
    }
  }
  // A field's declared wire type must be the one its schema gives.
  void expect(int got, int want, const char* field) {
    if (got != want) fail(std::string("field ") + field + " has wire type " + std::to_string(got) +
                          ", expected " + std::to_string(want));
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }

 private:
  void advance(size_t n) {
    if (b_.size() - pos_ < n) fail("a fixed-size field runs past the end");
    pos_ += n;
  }
  [[noreturn]] void fail_at(size_t at, const std::string& what) const {
    FH_FAIL(source_, ": not a valid sentencepiece model: ", what, " at byte ", base_ + at,
            " (is this file a tokenizer.model? a truncated download?)");
  }
  std::string_view b_;
  const std::string& source_;
  size_t base_, pos_ = 0;
};

enum PieceType { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct SpmPiece {
  std::string piece;
  int type = kNormal;
};

struct SpmModel {
  std::vector<SpmPiece> pieces;
  int model_type = 1;  // TrainerSpec.ModelType: UNIGRAM = 1 (the schema's default), BPE = 2
  int64_t unk_id = 0, bos_id = 1, eos_id = 2;  // the schema's defaults
};

int64_t as_int32(uint64_t v) { return int64_t(int32_t(uint32_t(v))); }  // negative ids are sign-extended

SpmPiece parse_piece(Wire w) {
  SpmPiece p;
  bool has_piece = false;
  while (!w.done()) {
    auto [field, wire] = w.key();
    size_t base = 0;
    if (field == 1) {
      w.expect(wire, 2, "SentencePiece.piece");
      p.piece = std::string(w.bytes(&base));
      has_piece = true;
    } else if (field == 2) {
      w.expect(wire, 5, "SentencePiece.score");
      (void)w.fixed32_float();  // the order of the pieces already encodes it (BPE: score = -id)
    } else if (field == 3) {
      w.expect(wire, 0, "SentencePiece.type");
      p.type = int(w.varint());
    } else {
      w.skip(wire);
    }
  }
  if (!has_piece) w.fail("a SentencePiece without its piece string");
  return p;
}

void parse_trainer(Wire w, SpmModel& m) {
  while (!w.done()) {
    const auto [field, wire_type] = w.key();
    const int wire = wire_type;  // clang 14 cannot capture a structured binding in a lambda
    auto int_field = [&](const char* name) {
      w.expect(wire, 0, name);
      return as_int32(w.varint());
    };
    if (field == 3) m.model_type = int(int_field("TrainerSpec.model_type"));
    else if (field == 40) m.unk_id = int_field("TrainerSpec.unk_id");
    else if (field == 41) m.bos_id = int_field("TrainerSpec.bos_id");
    else if (field == 42) m.eos_id = int_field("TrainerSpec.eos_id");
    else w.skip(wire);
  }
}

SpmModel parse_model_proto(std::string_view bytes, const std::string& source) {
  SpmModel m;
  Wire w(bytes, source, 0);
  while (!w.done()) {
    auto [field, wire] = w.key();
    size_t base = 0;
    if (field == 1) {
      w.expect(wire, 2, "ModelProto.pieces");
      const std::string_view sub = w.bytes(&base);
      m.pieces.push_back(parse_piece(Wire(sub, source, base)));
    } else if (field == 2) {
      w.expect(wire, 2, "ModelProto.trainer_spec");
      const std::string_view sub = w.bytes(&base);
      parse_trainer(Wire(sub, source, base), m);
    } else {
      w.skip(wire);  // normalizer_spec, self_test_data, denormalizer_spec: LlamaTokenizer reads none
    }
  }
  if (m.pieces.empty()) FH_FAIL(source, ": not a valid sentencepiece model: it holds no pieces");
  return m;
}

// transformers' generate_merges(vocab): every split of every piece into two pieces of the
// vocabulary, ordered by the id of the merged piece, then by the length of the left part (in
// characters); the loops below produce exactly that order.
json merges_of(const SpmModel& m, const std::unordered_map<std::string_view, int32_t>& ids) {
  json merges = json::array();
  for (const SpmPiece& p : m.pieces) {
    const std::string_view s = p.piece;
    for (size_t cut = utf8_char_len(s, 0); cut < s.size(); cut += utf8_char_len(s, cut)) {
      const std::string_view l = s.substr(0, cut), r = s.substr(cut);
      if (ids.count(l) && ids.count(r)) merges.push_back(json::array({std::string(l), std::string(r)}));
    }
  }
  return merges;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_char_len(s, i);
    if (len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += len;
  }
  return true;
}

bool config_flag(const json& cfg, const char* key, bool dflt, const std::string& where) {
  if (!cfg.is_object() || !cfg.contains(key) || cfg.at(key).is_null()) return dflt;
  if (!cfg.at(key).is_boolean()) FH_FAIL(where, ": \"", key, "\" must be true or false");
  return cfg.at(key).get<bool>();
}

}  // namespace

std::unique_ptr<Tokenizer::Impl> load_sentencepiece(const std::filesystem::path& file, const json& config) {
  const std::string source = file.string();
  const std::string cfg_name = (file.parent_path() / "tokenizer_config.json").string();
  if (config.is_object() && config.contains("tokenizer_class") && config.at("tokenizer_class").is_string()) {
    const std::string cls = config.at("tokenizer_class").get<std::string>();
    if (cls != "LlamaTokenizer" && cls != "LlamaTokenizerFast")
      FH_FAIL(cfg_name, ": tokenizer_class \"", cls, "\" with only a tokenizer.model is not supported (",
              "LlamaTokenizer is); a tokenizer.json for this checkpoint (transformers' save_pretrained writes one) is");
  }
  const SpmModel m = parse_model_proto(read_input_file(file, "tokenizer model", kMaxModelBytes), source);
  if (m.model_type != 2)
    FH_FAIL(source, ": a sentencepiece ", m.model_type == 1 ? "unigram" : "word/char", " model (model_type ",
            m.model_type, ") is not supported: only BPE models, as LLaMA-family checkpoints ship, are");

  const int32_t n = int32_t(m.pieces.size());
  std::unordered_map<std::string_view, int32_t> ids;
  ids.reserve(m.pieces.size());
  // Deriving merges hashes every split of every piece: work grows with the square of a piece's
  // length. Real pieces are a few characters (LLaMA: 32000 pieces, about 2 MB of such work).
  uint64_t merge_work = 0;
  for (const SpmPiece& p : m.pieces) merge_work += uint64_t(p.piece.size()) * p.piece.size();
  if (merge_work > kMaxMergeWork)
    FH_FAIL(source, ": the pieces are too long to derive BPE merges from (", merge_work, " byte steps, at most ",
            kMaxMergeWork, "); real models' pieces are a few characters each");
  json vocab = json::object(), added = json::array();
  for (int32_t id = 0; id < n; ++id) {
    const SpmPiece& p = m.pieces[size_t(id)];
    if (p.piece.empty()) FH_FAIL(source, ": piece ", id, " is empty");
    if (!valid_utf8(p.piece)) FH_FAIL(source, ": piece ", id, " is not valid UTF-8");
    if (!ids.emplace(p.piece, id).second)
      FH_FAIL(source, ": piece ", quote_prefix(p.piece), " appears twice (ids ", ids.at(p.piece), " and ", id, ")");
    vocab[p.piece] = id;
    // Control and unknown pieces are special tokens; user-defined pieces are matched in text
    // before BPE but are not special (transformers' SentencePieceExtractor).
    if (p.type == kUnknown || p.type == kControl || p.type == kUserDefined)
      added.push_back({{"id", id}, {"content", p.piece}, {"special", p.type != kUserDefined}, {"normalized", false}});
  }
  auto piece_of = [&](int64_t id) -> const std::string* {
    return id >= 0 && id < n ? &m.pieces[size_t(id)].piece : nullptr;
  };

  // LlamaTokenizer: legacy (default false) prepends U+2581 to every run of text between
  // special tokens, otherwise only at the start of the input; add_prefix_space false never.
  const bool legacy = config_flag(config, "legacy", false, cfg_name);
  const bool prefix_space = config_flag(config, "add_prefix_space", true, cfg_name);
  json model = {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", merges_of(m, ids)},
                {"byte_fallback", true}, {"fuse_unk", true}};
  if (const std::string* unk = piece_of(m.unk_id)) model["unk_token"] = *unk;
  json decoders = json::array({{{"type", "Replace"}, {"pattern", {{"String", kSpace}}}, {"content", " "}},
                               {{"type", "ByteFallback"}},
                               {{"type", "Fuse"}}});
  if (prefix_space) decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  json doc = {{"model", std::move(model)},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", kSpace}, {"split", false},
                                 {"prepend_scheme", !prefix_space ? "never" : legacy ? "always" : "first"}}},
              {"decoder", {{"type", "Sequence"}, {"decoders", std::move(decoders)}}},
              {"added_tokens", std::move(added)}};
  // No post-processor: as in transformers 5, tokenizer_config.json's add_bos_token and
  // add_eos_token say what encode(text, true) adds, and nothing is added without them
  // (apply_configs).
  auto impl = load_tokenizer_doc(doc, source);
  if (piece_of(m.bos_id)) impl->bos = int32_t(m.bos_id);
  if (piece_of(m.eos_id)) impl->eos = int32_t(m.eos_id);
  return impl;
}

}  // namespace flexh2o::tok
