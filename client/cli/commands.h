// The subcommands of `memest`: each takes its parsed flags and returns the process's exit code
// (client/cli/exit_codes.h), printing the answer to stdout and errors to stderr.
#ifndef MEMEST_CLIENT_CLI_COMMANDS_H_
#define MEMEST_CLIENT_CLI_COMMANDS_H_

#include "client/cli/flags.h"
#include "client/cli/plan_flags.h"
#include "client/cli/sweep_flags.h"

namespace memest::cli {

// `memest estimate`: 0 when it fits (or no device was given), 2 when it does not fit.
int RunEstimate(const ConnectionFlags& connection, const EstimateFlags& flags);
// `memest validate`: 0 when the validation ran (whatever it found).
int RunValidate(const ConnectionFlags& connection, const ValidateFlags& flags);
// `memest plan`: 0 when some plan fits, 2 when none does within the GPU budget.
int RunPlan(const ConnectionFlags& connection, const PlanFlags& flags);
// `memest sweep`: 0 when some configuration fits (or no device was given), 2 when none does;
// every configuration refused: the first refusal's code.
int RunSweep(const ConnectionFlags& connection, const SweepFlags& flags);
// `memest presets`.
int RunPresets(const ConnectionFlags& connection);
// `memest devices`.
int RunDevices(const ConnectionFlags& connection);

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_COMMANDS_H_
