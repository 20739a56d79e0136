// memest: how much GPU memory will this PyTorch step need, and what would make it fit?
//
//   memest estimate --preset gpt2-small --batch 8 --seq 1024 --optimizer adamw --precision bf16
//   memest estimate --model examples/mlp.json --batch 64 --capacity 8GiB --local
//   memest validate --preset gpt2-small --batch 8 --server gpu-host:50051
//   memest sweep --preset gpt2-small --seq 1024 --batches 1,2,4,8 --devices l4,a100-80gb --local
//   memest presets | memest devices
#include <CLI/CLI.hpp>

#include "client/cli/commands.h"
#include "client/cli/exit_codes.h"
#include "client/cli/flags.h"
#include "version/version.h"

int main(int argc, char** argv) {
  using namespace memest::cli;  // NOLINT(build/namespaces)

  CLI::App app{"memest: predicts the GPU memory of a PyTorch training or inference step, op by op",
               "memest"};
  app.require_subcommand(1);
  app.set_version_flag("--version", memest::VersionString("memest"),
                       "print the build's version and exit");
  app.footer(ExitCodesHelp());

  ConnectionFlags connection;
  EstimateFlags estimate_flags;

  CLI::App* estimate = app.add_subcommand(
      "estimate", "estimate the memory of one step of a preset or a model file");
  AddEstimateFlags(estimate, &estimate_flags);
  AddConnectionFlags(estimate, &connection);
  estimate->footer(ExitCodesHelp());

  ValidateFlags validate_flags;
  ConnectionFlags validate_connection;
  validate_connection.deadline_ms = 30 * 60 * 1000;  // a validation runs kernels: minutes, not ms
  CLI::App* validate = app.add_subcommand(
      "validate", "run the step on the server's GPU and compare predicted with measured");
  AddValidateFlags(validate, &validate_flags);
  AddConnectionFlags(validate, &validate_connection);
  validate->footer(ExitCodesHelp());

  PlanFlags plan_flags;
  ConnectionFlags plan_connection;
  plan_connection.deadline_ms = 60 * 1000;  // a search runs many estimates: seconds
  CLI::App* plan = app.add_subcommand(
      "plan", "the ways to split a training job over GPUs that fit, fewest GPUs first "
              "(--batch is the global batch)");
  AddPlanFlags(plan, &plan_flags);
  AddConnectionFlags(plan, &plan_connection);
  plan->footer(ExitCodesHelp());

  SweepFlags sweep_flags;
  ConnectionFlags sweep_connection;
  sweep_connection.deadline_ms = 10 * 60 * 1000;  // thousands of estimates: minutes at most
  CLI::App* sweep = app.add_subcommand(
      "sweep", "estimate one model under every combination of lists of batch sizes, devices, "
               "precisions, optimizers and checkpoint policies, in one call");
  AddSweepFlags(sweep, &sweep_flags);
  AddConnectionFlags(sweep, &sweep_connection);
  sweep->footer(ExitCodesHelp());

  CLI::App* presets =
      app.add_subcommand("presets", "list the built-in models and their parameters");
  AddConnectionFlags(presets, &connection);

  CLI::App* devices = app.add_subcommand("devices", "list the device catalog");
  AddConnectionFlags(devices, &connection);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help (code 0) or the error
    return code == 0 ? kExitFits : kExitBadInput;
  }

  if (estimate->parsed()) return RunEstimate(connection, estimate_flags);
  if (validate->parsed()) return RunValidate(validate_connection, validate_flags);
  if (plan->parsed()) return RunPlan(plan_connection, plan_flags);
  if (sweep->parsed()) return RunSweep(sweep_connection, sweep_flags);
  if (presets->parsed()) return RunPresets(connection);
  return RunDevices(connection);
}
