// memest-webhook: a Kubernetes admission webhook that checks a workload's GPUs against its model
// (webhook/admission.h, docs/kubernetes.md).
//
//   memest-webhook --address 0.0.0.0:8443 --serving-cert tls.crt --serving-key tls.key
//       --server memest:50051                  (or --local: plan in this process)
//
// Prints "memest-webhook listening on HOST:PORT" once it listens; SIGTERM or SIGINT stop it
// after the requests in progress.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "client/cli/backend.h"
#include "client/cli/flags.h"
#include "version/version.h"
#include "webhook/admission.h"
#include "webhook/https_server.h"
#include "webhook/planner.h"

int main(int argc, char** argv) {
  using namespace memest;
  std::string address = "0.0.0.0:8443", cert, key, model_dir;
  int threads = 16;
  bool fail_closed = false;
  webhook::AdmissionOptions options;
  cli::ConnectionFlags connection;
  CLI::App app{"memest-webhook: a Kubernetes admission webhook that checks a workload's GPUs"};
  app.set_version_flag("--version", VersionString("memest-webhook"));
  app.add_option("--address", address, "HOST:PORT to serve HTTPS on (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--serving-cert", cert, "the webhook's certificate chain (PEM; reread on change)")
      ->required();
  app.add_option("--serving-key", key, "its private key (PEM)")->required();
  app.add_option("--threads", threads, "request threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--default-device", options.default_device,
                 "the memest device of a workload without a nvidia.com/gpu.product node selector")
      ->capture_default_str();
  app.add_option("--product", options.products,
                 "PRODUCT=DEVICE: a GPU feature discovery product name and its memest device, "
                 "beside the built-in ones (repeatable)")
      ->delimiter(',');
  app.add_option("--max-gpus", options.max_gpus,
                 "the most GPUs looked at to say what would fit, or to fill in")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--model-dir", model_dir,
                 "a directory whose model files (--hf-config, --model) annotations may name");
  app.add_flag("--fail-closed", fail_closed,
               "deny a workload memest could not check (default: allow it, with a warning)");
  cli::AddConnectionFlags(&app, &connection);
  CLI11_PARSE(app, argc, argv);
  options.fail_open = !fail_closed;

  // A peer that closed its connection must cost a failed write, not the process.
  signal(SIGPIPE, SIG_IGN);
  // Taken by sigwait below: blocked before any thread starts, so that every thread inherits it.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  std::shared_ptr<cli::Backend> backend =
      connection.local ? cli::MakeLocalBackend()
                       : cli::MakeRemoteBackend(connection.server, connection.deadline_ms,
                                                connection.auth_token_file, connection.tls);
  const webhook::Planner planner = webhook::MakePlanner(backend, model_dir);
  auto server = webhook::HttpsServer::Start(
      address, cert, key, threads, [&](const std::string& body, bool mutate) {
        return webhook::Review(body, mutate, options, planner);
      });
  if (!server.ok()) {
    std::cerr << "memest-webhook: " << server.status().message() << '\n';
    return 1;
  }
  const std::string host = address.substr(0, address.rfind(':'));
  std::printf("memest-webhook listening on %s:%d\n", host.c_str(), (*server)->port());
  std::fflush(stdout);

  int signal = 0;
  sigwait(&stop, &signal);
  return 0;  // the server stops after the requests in progress
}
