// The _flexh2o extension module (pybind11): Session (flexh2o.LLM's engine side), the command
// line (`python -m flexh2o`), and flexh2o.Error. The engine runs with the GIL released; no
// Python code is called from engine threads (the chat hook takes the GIL on the calling thread).
// generate runs on a worker thread so that Ctrl-C raises KeyboardInterrupt within a token step.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <thread>

#include "cli/app.h"
#include "cli/sampling_flags.h"
#include "core/error.h"
#include "core/input_guard.h"
#include "python/session.h"

namespace py = pybind11;
using namespace flexh2o;

namespace {

HubEnv hub_env(const std::optional<std::string>& hub_cache, const std::optional<std::string>& hf_home,
                    const std::optional<std::string>& home) {
  HubEnv h;
  auto path = [](const std::optional<std::string>& s) -> std::optional<std::filesystem::path> {
    if (!s || s->empty()) return std::nullopt;
    return std::filesystem::path(*s);
  };
  h.hf_hub_cache = path(hub_cache);
  h.hf_home = path(hf_home);
  h.home = path(home);
  return h;
}

// Runs fn() on a worker thread while the calling thread, with the GIL released, wakes every
// 50 ms to let Python run its signal handlers (it can only while it holds the GIL). When one
// raises (Ctrl-C: KeyboardInterrupt), `interrupt` is set, fn is waited for (it ends within its
// step under way) and the Python exception propagates. An exception from fn is rethrown here.
template <class F>
void run_interruptible(std::atomic<bool>& interrupt, F fn) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr failure;
  std::thread worker([&] {
    try {
      fn();
    } catch (...) {
      failure = std::current_exception();
    }
    std::lock_guard<std::mutex> lk(mu);
    done = true;
    cv.notify_all();
  });
  auto wait = [&](std::chrono::milliseconds d) {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, d, [&] { return done; });
  };
  bool signalled = false;
  while (!wait(std::chrono::milliseconds(50)))
    if (!signalled && PyErr_CheckSignals() != 0) {
      signalled = true;  // the exception is pending; fn ends within its step under way
      interrupt = true;
    }
  worker.join();
  if (signalled) throw py::error_already_set();
  if (failure) std::rethrow_exception(failure);
}

// fn(&interrupt) under run_interruptible, its result returned: a call that ends within its step
// under way once Ctrl-C sets `interrupt`.
template <class F>
auto call_interruptible(F fn) {
  std::atomic<bool> interrupt{false};
  decltype(fn(&interrupt)) out;
  run_interruptible(interrupt, [&] { out = fn(&interrupt); });
  return out;
}

// A Python exception as one message, "TypeError: can only concatenate ..." (flexh2o.Error, whose
// messages are ours: the message alone), without the "At:" stack error_already_set::what() appends.
std::string message_of(const py::error_already_set& e, PyObject* flexh2o_error) {
  const std::string text = py::str(e.value());
  if (e.matches(flexh2o_error)) return text;
  return std::string(py::str(e.type().attr("__name__"))) + ": " + text;
}

// A flag another Python thread sets to end a Session.openai call within its step under way (a
// server's engine thread runs the call; only the main thread sees signals).
struct StopFlag {
  std::atomic<bool> set{false};
};

}  // namespace

PYBIND11_MODULE(_flexh2o, m) {
  m.doc() = "flexh2o engine bindings (use the flexh2o package, not this module)";
  m.attr("__version__") = cli::version();
  // Kept for the life of the process (never released: the translator may run until exit).
  static PyObject* error = py::exception<Error>(m, "Error", PyExc_RuntimeError).release().ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const python::UnknownFlag& e) {
      PyErr_SetString(PyExc_TypeError, printable_utf8(e.what()).c_str());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(error, cli::out_of_memory_message("flexh2o.LLM").c_str());
    } catch (const py::builtin_exception&) {
      throw;  // pybind11's own (type errors of arguments, ...)
    } catch (const py::error_already_set&) {
      throw;
    } catch (const std::exception& e) {
      // Python decodes the message as UTF-8: bytes quoted from a bad file would leave it empty.
      PyErr_SetString(error, printable_utf8(e.what()).c_str());
    }
  });

  py::class_<python::Session>(m, "Session")
      .def(py::init([](const std::string& model, const std::string& tokenizer, const std::string& device,
                       int64_t batch_size, int threads, const std::vector<std::tuple<std::string, std::vector<std::string>, bool>>& flags,
                       const std::string& configs_dir, const std::optional<std::string>& hf_hub_cache,
                       const std::optional<std::string>& hf_home, const std::optional<std::string>& home,
                       bool stderr_is_tty, const std::string& generation_config) {
             python::SessionOptions o;
             o.model = model;
             o.tokenizer = tokenizer;
             o.device = device;
             o.batch_size = batch_size;
             o.threads = threads;
             o.generation_config = generation_config;
             for (const auto& [name, values, is_bool] : flags) o.flags.push_back({name, values, is_bool});
             o.env.hub = hub_env(hf_hub_cache, hf_home, home);
             o.env.configs_dir = configs_dir;
             o.env.stderr_is_tty = stderr_is_tty;
             py::gil_scoped_release nogil;  // loading maps and checks the checkpoint
             return std::make_unique<python::Session>(std::move(o));
           }),
           py::arg("model"), py::arg("tokenizer"), py::arg("device"), py::arg("batch_size"), py::arg("threads"),
           py::arg("flags"), py::arg("configs_dir"), py::arg("hf_hub_cache"), py::arg("hf_home"), py::arg("home"),
           py::arg("stderr_is_tty"), py::arg("generation_config") = "auto")
      .def_property_readonly("name", &python::Session::name)
      .def_property_readonly("vocab_size", &python::Session::vocab_size)
      .def_property_readonly("max_length", &python::Session::max_length)
      .def_property_readonly("eos_id", &python::Session::eos_id)
      .def_property_readonly("eos_ids", &python::Session::eos_ids)
      .def_property_readonly("bos_id", &python::Session::bos_id)
      .def_property_readonly("tokenizer_dir", &python::Session::tokenizer_dir)
      // ([(key, value)] in cli::kGenerationConfigKeys order, the file's path or "").
      .def_property_readonly("generation_config",
                             [](const python::Session& s) {
                               const cli::GenerationConfig& g = s.generation_config();
                               return py::make_tuple(g.values, g.file.string());
                             })
      .def("encode", &python::Session::encode, py::arg("text"), py::arg("add_special"))
      .def("decode", &python::Session::decode, py::arg("ids"))
      .def(
          "generate",
          [](python::Session& s, const std::vector<python::Prompt>& prompts, int64_t max_new_tokens, float temperature,
             int top_k, float top_p, uint64_t seed, bool ignore_eos, std::vector<std::string> stop, float min_p,
             float repetition_penalty, float presence_penalty, float frequency_penalty, int logprobs,
             std::vector<std::pair<int32_t, float>> logit_bias, bool continuous) {
            std::atomic<bool> interrupt{false};
            python::GenerateParams p{max_new_tokens, temperature, top_p, top_k, seed, ignore_eos, std::move(stop),
                                     &interrupt, min_p, repetition_penalty, presence_penalty, frequency_penalty,
                                     logprobs, std::move(logit_bias), continuous};
            std::vector<python::Completion> out;
            run_interruptible(interrupt, [&] { out = s.generate(prompts, p); });
            py::list l;
            for (auto& c : out) {
              py::list top;
              for (const auto& step : c.top_logprobs) {
                py::list alts;
                for (const TokenLogprob& t : step) alts.append(py::make_tuple(t.id, t.logprob));
                top.append(alts);
              }
              l.append(py::make_tuple(py::bytes(c.text), c.token_ids, c.finish_reason, c.logprobs, top));
            }
            return l;
          },
          py::arg("prompts"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
          py::arg("seed"), py::arg("ignore_eos"), py::arg("stop"), py::arg("min_p") = 0.f,
          py::arg("repetition_penalty") = 1.f, py::arg("presence_penalty") = 0.f, py::arg("frequency_penalty") = 0.f,
          py::arg("logprobs") = -1, py::arg("logit_bias") = std::vector<std::pair<int32_t, float>>{},
          py::arg("continuous") = false)
      .def("prepare", &python::Session::prepare, py::arg("prompt_len"), py::arg("gen_len"), py::arg("requests"),
           py::call_guard<py::gil_scoped_release>())
      // OpenAI Batch input lines -> output lines (Session::openai), with the GIL released.
      // `render_chat(body_json_text) -> str`, `on_event(line, "chunk" | "line" | "defer" | "alive",
      // json_text) -> bool | None` (False to a chunk or "alive", asked each token of a line not
      // streamed: its client has gone) and `more_lines() -> [str]` (optional)
      // are called with the GIL held.
      .def(
          "openai",
          [](python::Session& s, const std::vector<std::string>& lines, bool greedy, int top_k, float min_p,
             float repetition_penalty, uint64_t seed, int64_t max_tokens_cap, int64_t plan_prompt_len,
             int64_t plan_gen_len, int64_t plan_requests, py::object render_chat, StopFlag* stop, bool stream,
             py::object on_event, bool continuous, py::object more_lines, const std::string& model_name,
             bool ignore_eos) {
            python::OpenAiParams p;
            p.model_name = model_name;
            p.defaults = {greedy, top_k, min_p, repetition_penalty, seed, max_tokens_cap};
            p.plan_prompt_len = plan_prompt_len;
            p.plan_gen_len = plan_gen_len;
            p.plan_requests = plan_requests;
            p.interrupt = stop ? &stop->set : nullptr;
            p.stream = stream;
            p.continuous = continuous;
            p.ignore_eos = ignore_eos;
            // Owned by shared_ptrs whose last copies are dropped with the GIL held (at return).
            auto fn = std::make_shared<py::object>(render_chat);
            auto ev = std::make_shared<py::object>(on_event);
            auto more = std::make_shared<py::object>(more_lines);
            if (!more_lines.is_none())
              p.more_lines = [more]() {
                py::gil_scoped_acquire gil;
                try {
                  return (*more)().cast<std::vector<std::string>>();
                } catch (py::error_already_set& e) {
                  FH_FAIL(std::string(py::str(e.value())));
                }
              };
            using Event = cli::openai_batch::LiveAnswers::Event;
            if (!on_event.is_none())
              p.on_event = [ev](size_t line, Event kind, const std::string& payload) {
                py::gil_scoped_acquire gil;
                try {
                  const char* name = kind == Event::kChunk  ? "chunk"
                                     : kind == Event::kLine ? "line"
                                     : kind == Event::kAlive ? "alive"
                                                             : "defer";
                  const py::object keep = (*ev)(line, name, payload);
                  return keep.is_none() || keep.cast<bool>();
                } catch (py::error_already_set& e) {
                  FH_FAIL(std::string(py::str(e.value())));
                }
              };
            if (!render_chat.is_none())
              p.render_chat = [fn](const nlohmann::ordered_json& body) -> std::string {
                py::gil_scoped_acquire gil;
                try {
                  return (*fn)(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).cast<std::string>();
                } catch (py::error_already_set& e) {
                  FH_FAIL(message_of(e, error));
                }
              };
            std::vector<std::string> out;
            {
              py::gil_scoped_release nogil;
              try {
                out = s.openai(lines, p);
              } catch (...) {
                p.render_chat = nullptr;
                p.on_event = nullptr;
                p.more_lines = nullptr;
                throw;
              }
              p.render_chat = nullptr;
              p.on_event = nullptr;
              p.more_lines = nullptr;
            }
            return out;
          },
          py::arg("lines"), py::arg("greedy") = false, py::arg("top_k") = 0, py::arg("min_p") = 0.f,
          py::arg("repetition_penalty") = 1.f, py::arg("seed") = 0, py::arg("max_tokens_cap") = 0,
          py::arg("plan_prompt_len") = 0, py::arg("plan_gen_len") = 0, py::arg("plan_requests") = 0,
          py::arg("render_chat") = py::none(), py::arg("stop") = nullptr, py::arg("stream") = false,
          py::arg("on_event") = py::none(), py::arg("continuous") = false, py::arg("more_lines") = py::none(),
          py::arg("model_name") = std::string(), py::arg("ignore_eos") = false)
      .def(
          "loglikelihood",
          [](python::Session& s, const std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>>& requests,
             bool streaming) {
            return call_interruptible(
                [&](const std::atomic<bool>* i) { return s.loglikelihood(requests, streaming, i); });
          },
          py::arg("requests"), py::arg("streaming") = false)
      .def(
          "loglikelihood_rolling",
          [](python::Session& s, const std::vector<std::vector<int32_t>>& seqs) {
            return call_interruptible([&](const std::atomic<bool>* i) { return s.loglikelihood_rolling(seqs, i); });
          },
          py::arg("seqs"))
      .def(
          "score",
          [](python::Session& s, const std::vector<std::vector<int32_t>>& seqs, int top) {
            return call_interruptible([&](const std::atomic<bool>* i) { return s.score(seqs, top, i); });
          },
          py::arg("seqs"), py::arg("top"))
      .def("last_report", &python::Session::last_report, py::call_guard<py::gil_scoped_release>());

  py::class_<StopFlag>(m, "StopFlag")
      .def(py::init<>())
      .def("set", [](StopFlag& f) { f.set = true; })
      .def("is_set", [](const StopFlag& f) { return f.set.load(); });

  // serve's sampling defaults, checked as generate checks its flags (check_sampling_defaults):
  // raises Error naming the flag, so that no request gets the server's mistake as its own 400.
  m.def(
      "check_sampling_defaults",
      [](int64_t top_k, float min_p, float repetition_penalty) {
        if (top_k > INT32_MAX || top_k < INT32_MIN)
          FH_FAIL("top_k must be at most ", INT32_MAX, ", got ", top_k, " (--top-k)");
        cli::GenerateArgs a;
        a.generation_config = "none";  // the server reads no generation_config.json
        a.top_k = int(top_k);
        a.min_p = min_p;
        a.repetition_penalty = repetition_penalty;
        cli::check_sampling_defaults(a);
      },
      py::arg("top_k"), py::arg("min_p"), py::arg("repetition_penalty"));

  // The command line. `render_chat(template_dir, body_json_text) -> str` (optional) is called
  // on this thread with the GIL held; its exceptions become the chat line's error.
  m.def(
      "run_cli",
      [](const std::vector<std::string>& args, const std::string& configs_dir, const std::optional<std::string>& hf_hub_cache,
         const std::optional<std::string>& hf_home, const std::optional<std::string>& home, bool stderr_is_tty,
         bool handle_signals, py::object render_chat, bool mpi, int mpi_ranks) {
        cli::MainOptions o;
        o.mpi = mpi;
        o.mpi_ranks = mpi_ranks;
        o.hub = hub_env(hf_hub_cache, hf_home, home);
        o.default_configs_dir = configs_dir;
        o.stderr_is_tty = stderr_is_tty;
        o.handle_signals = handle_signals;
        // Owned by a shared_ptr whose last copy is dropped with the GIL held (below).
        auto fn = std::make_shared<py::object>(render_chat);
        if (!render_chat.is_none())
          o.render_chat = [fn](const std::filesystem::path& dir, const nlohmann::ordered_json& body) -> std::string {
            py::gil_scoped_acquire gil;
            try {
              return (*fn)(dir.string(), body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
                  .cast<std::string>();
            } catch (py::error_already_set& e) {
              FH_FAIL(message_of(e, error));  // a line's error message: no Python stack
            }
          };
        std::vector<const char*> argv;
        for (const auto& a : args) argv.push_back(a.c_str());
        int code = 0;
        {
          py::gil_scoped_release nogil;
          code = cli::run_main(int(argv.size()), argv.data(), o);
          o.render_chat = nullptr;
        }
        return code;
      },
      py::arg("args"), py::arg("configs_dir"), py::arg("hf_hub_cache"), py::arg("hf_home"), py::arg("home"),
      py::arg("stderr_is_tty"), py::arg("handle_signals"), py::arg("render_chat"), py::arg("mpi") = false,
      py::arg("mpi_ranks") = 0);
}
