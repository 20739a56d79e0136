// memest-validate-worker: runs one validation in its own process, for memest-server.
//
//   memest-validate-worker --device 0 < request.bin > frames.bin
//   memest-validate-worker --device 0 --probe
//
// Reads a serialized memest.v1.ValidateRequest from stdin, validates it on the device and writes
// frames to stdout (server/worker_protocol.h): progress events, the result, the final status.
// --probe opens the device and answers with its status only: the server asks this at startup.
// The --fake-* options replace the GPU with validate/fake_device.h, for tests of the server's
// queue, deadlines, cancellation and crash handling on machines without a GPU.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>

#include "server/validate_convert.h"
#include "server/worker_protocol.h"
#include "validate/fake_device.h"
#include "validate/validation.h"
#include "version/version.h"
#ifdef MEMEST_HAVE_CUDA
#include "kernels/cuda_device.h"
#endif

namespace {

using memest::Status;
using memest::StatusOr;
namespace validate = memest::validate;

// A fake device that is also slow or crashes, as a real one might.
class TestDevice : public validate::FakeDevice {
 public:
  TestDevice(validate::FakeDeviceOptions o, int run_ms, int abort_after)
      : FakeDevice(std::move(o)), run_ms_(run_ms), abort_after_(abort_after) {}
  StatusOr<validate::Timing> Run(const validate::Work& work, int repeats) override {
    if (abort_after_ >= 0 && runs_++ >= abort_after_) std::abort();  // as a CUDA fault would
    if (run_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(run_ms_));
    return FakeDevice::Run(work, repeats);
  }

 private:
  int run_ms_, abort_after_, runs_ = 0;
};

StatusOr<std::unique_ptr<validate::Device>> OpenDevice(int device, double fake_gib, int fake_run_ms,
                                                       int fake_abort_after) {
  if (fake_gib > 0) {
    validate::FakeDeviceOptions o;
    o.total_bytes = static_cast<int64_t>(fake_gib * (1 << 30));
    return std::unique_ptr<validate::Device>(
        std::make_unique<TestDevice>(o, fake_run_ms, fake_abort_after));
  }
#ifdef MEMEST_HAVE_CUDA
  auto cuda = memest::kernels::CudaDevice::Open(device);
  if (!cuda.ok()) return cuda.status();
  return std::unique_ptr<validate::Device>(std::move(*cuda));
#else
  return memest::Unavailable(
      "this memest was built without CUDA: it estimates but cannot validate "
      "on a GPU (rebuild where nvcc and the CUDA toolkit are found)");
#endif
}

Status Validate(validate::Device& device, int out) {
  std::string bytes((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  memest::v1::ValidateRequest request;
  if (!request.ParseFromString(bytes))
    return memest::InvalidArgument("request: not a ValidateRequest");
  MEMEST_ASSIGN_OR_RETURN(memest::ValidateInput in, memest::ValidateInputFromProto(request));
  in.options.progress = [out](const validate::Progress& p) {
    memest::v1::ValidateEvent e;
    memest::ProgressToProto(p, e.mutable_progress());
    memest::worker::WriteEvent(out, e);
  };
  MEMEST_ASSIGN_OR_RETURN(validate::Validation v,
                          validate::Validate(in.model, in.config, device, in.options));
  memest::v1::ValidateEvent e;
  memest::ValidationToProto(v, e.mutable_result());
  if (!memest::worker::WriteEvent(out, e)) return memest::Internal("cannot write the result");
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  bool probe = false;
  double fake_gib = 0;
  int fake_run_ms = 0, fake_abort_after = -1;
  CLI::App app{"memest-validate-worker: one validation on a GPU, for memest-server"};
  app.set_version_flag("--version", memest::VersionString("memest-validate-worker"),
                       "print the build's version and exit");
  app.add_option("--device", device, "CUDA device ordinal")->capture_default_str();
  app.add_flag("--probe", probe, "open the device and report whether it can validate");
  app.add_option("--fake-device-gib", fake_gib,
                 "tests: a fake device of this many GiB instead of a GPU");
  app.add_option("--fake-run-ms", fake_run_ms, "tests: each fake kernel takes this long");
  app.add_option("--fake-abort-after-runs", fake_abort_after,
                 "tests: abort (as a CUDA fault would) after this many kernels");
  CLI11_PARSE(app, argc, argv);

  // stdout carries frames only; anything a library prints goes to stderr.
  const int out = dup(STDOUT_FILENO);
  dup2(STDERR_FILENO, STDOUT_FILENO);

  StatusOr<std::unique_ptr<validate::Device>> dev =
      OpenDevice(device, fake_gib, fake_run_ms, fake_abort_after);
  Status status = dev.status();
  if (dev.ok()) {
    if (probe) {
      StatusOr<validate::DeviceProbe> p = (*dev)->Probe();
      status = p.ok() ? Status(memest::StatusCode::kOk, p->name) : p.status();
    } else {
      status = Validate(**dev, out);
    }
  }
  memest::worker::WriteStatus(out, status);
  return 0;
}
