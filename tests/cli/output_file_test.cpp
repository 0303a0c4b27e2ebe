// OutputFile's promises checked directly: a replaced file is the old one or the whole new one
// (never a part, never a leftover temporary), a symlinked output keeps its link, append mode
// appends, and the same-file check sees through links.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include "cli/output_file.h"
#include "core/error.h"
#include "engine/test_util.h"

namespace flexh2o::cli {
namespace {
namespace fs = std::filesystem;
using test::read_text;
using test::TempDir;

size_t entries(const fs::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++n;
  return n;
}

TEST(OutputFile, ReplaceIsAllOrNothing) {
  TempDir tmp;
  const fs::path p = tmp.path() / "r.json";
  write_text_file({"--report", p}, "old\n");
  {
    OutputFile f({"--report", p}, OutputFile::Mode::kReplace);
    f.write("half of the new");
    f.flush();
    EXPECT_EQ(read_text(p), "old\n");  // readers still see the old file
  }                                    // no commit: abandoned
  EXPECT_EQ(read_text(p), "old\n");
  EXPECT_EQ(entries(tmp.path()), 1u);  // the temporary is gone
  write_text_file({"--report", p}, "new\n");
  EXPECT_EQ(read_text(p), "new\n");
  EXPECT_EQ(entries(tmp.path()), 1u);
}

TEST(OutputFile, ReplaceThroughASymlinkKeepsTheLink) {
  TempDir tmp;
  fs::create_directory(tmp.path() / "real");
  const fs::path target = tmp.path() / "real/out.jsonl", link = tmp.path() / "out.jsonl";
  write_text_file({"", target}, "old\n");
  fs::create_symlink(target, link);
  write_text_file({"--output", link}, "new\n");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_text(target), "new\n");
}

TEST(OutputFile, AppendAppendsAndTruncateEmpties) {
  TempDir tmp;
  const fs::path p = tmp.path() / "o.jsonl";
  for (int i = 0; i < 2; ++i) {
    OutputFile f({"--output", p}, OutputFile::Mode::kAppend);
    f.write("line\n");
    f.sync();
    f.commit();
  }
  EXPECT_EQ(read_text(p), "line\nline\n");
  OutputFile f({"--output", p}, OutputFile::Mode::kTruncate);
  f.commit();
  EXPECT_EQ(read_text(p), "");
}

// An output removed or moved away while a run appends to it: the next sync() says so (and marks
// the file failed, so no line is retried) instead of writing on into a file nobody will find.
TEST(OutputFile, AnAppendedFileRemovedOrMovedIsSaidAtTheNextSync) {
  TempDir tmp;
  const fs::path p = tmp.path() / "o.jsonl", moved = tmp.path() / "moved.jsonl";
  for (const bool remove : {true, false}) {
    OutputFile f({"--output", p}, OutputFile::Mode::kAppend);
    f.write("one\n");
    f.sync();
    if (remove) fs::remove(p);
    else fs::rename(p, moved);
    f.write("two\n");
    try {
      f.sync();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--output " + p.string() + " no longer names the file this run writes: it "
                                           "was " + (remove ? "removed" : "moved or replaced")),
                std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(f.failed());
  }
  EXPECT_EQ(read_text(moved), "one\ntwo\n");  // the moved file has what was written
  EXPECT_FALSE(fs::exists(p));
}

TEST(OutputFile, ErrorsNameTheFlagAndPath) {
  TempDir tmp;
  try {
    OutputFile f({"--output", tmp.path()}, OutputFile::Mode::kAppend);
    ADD_FAILURE() << "a directory was opened for writing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--output " + tmp.path().string() + ": it is a directory"),
              std::string::npos) << e.what();
  }
  try {
    write_text_file({"--report", tmp.path() / "missing/r.json"}, "x");
    ADD_FAILURE() << "no error for a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

TEST(OutputFile, SameFileCheckSeesThroughLinksAndAbsentFiles) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  write_text_file({"", in}, "x\n");
  fs::create_symlink(in, tmp.path() / "sym");
  fs::create_hard_link(in, tmp.path() / "hard");
  fs::create_symlink(tmp.path() / "later", tmp.path() / "dangling");
  auto refused = [&](const std::vector<NamedPath>& outs) {
    try {
      check_outputs_are_not_inputs(outs, {{"--input", in}});
    } catch (const Error&) {
      return true;
    }
    return false;
  };
  EXPECT_TRUE(refused({{"--output", in}}));
  EXPECT_TRUE(refused({{"--output", tmp.path() / "sym"}}));
  EXPECT_TRUE(refused({{"--output", tmp.path() / "hard"}}));
  EXPECT_TRUE(refused({{"--output", tmp.path() / "." / "in.jsonl"}}));
  EXPECT_TRUE(refused({{"--output", tmp.path() / "a"}, {"--report", tmp.path() / "./a"}}));
  EXPECT_TRUE(refused({{"--output", tmp.path() / "dangling"}, {"--report", tmp.path() / "later"}}));
  EXPECT_FALSE(refused({{"--output", tmp.path() / "a"}, {"--report", tmp.path() / "b"}}));
  EXPECT_FALSE(refused({{"--output", "/dev/null"}, {"--report", "/dev/null"}}));
  EXPECT_FALSE(refused({{"--output", ""}, {"--report", ""}}));
}

// `-i - < results.jsonl -o results.jsonl`: standard input redirected from the output is an input.
TEST(OutputFile, SameFileCheckSeesStandardInputsFile) {
  TempDir tmp;
  const fs::path in = tmp.path() / "in.jsonl";
  write_text_file({"", in}, "x\n");
  const int saved = ::dup(STDIN_FILENO);
  ASSERT_GE(saved, 0);
  const int fd = ::open(in.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::dup2(fd, STDIN_FILENO), STDIN_FILENO);
  ::close(fd);
  std::string error;
  try {
    check_outputs_are_not_inputs({{"--output", tmp.path() / "." / "in.jsonl"}}, {{"--input", "-"}});
  } catch (const Error& e) {
    error = e.what();
  }
  bool other_refused = false;
  try {
    check_outputs_are_not_inputs({{"--output", tmp.path() / "out.jsonl"}}, {{"--input", "-"}});
  } catch (const Error&) {
    other_refused = true;
  }
  ASSERT_EQ(::dup2(saved, STDIN_FILENO), STDIN_FILENO);
  ::close(saved);
  EXPECT_NE(error.find("is the same file as --input - (standard input)"), std::string::npos) << error;
  EXPECT_FALSE(other_refused);
}

}  // namespace
}  // namespace flexh2o::cli
