// The exit codes of `memest`, which scripts branch on (documented in the README and --help).
#ifndef MEMEST_CLIENT_CLI_EXIT_CODES_H_
#define MEMEST_CLIENT_CLI_EXIT_CODES_H_

#include <grpcpp/support/status.h>

#include <string>

namespace memest::cli {

enum ExitCode : int {
  kExitFits = 0,        // the estimate fits the device, or no device was given
  kExitInternal = 1,    // a bug in memest (INTERNAL, or anything unexpected)
  kExitDoesNotFit = 2,  // the estimate does not fit the device
  kExitBadInput = 3,    // bad flags, an unreadable model file, INVALID_ARGUMENT, NOT_FOUND,
                        // RESOURCE_EXHAUSTED (request too large), FAILED_PRECONDITION
  kExitRpcFailure = 4,  // the server is unreachable, timed out, or failed otherwise
};

// The exit code for a failed call (status not OK). Engine errors of --local runs and of
// flag checking are first mapped by the server's status conversion (server/status_conversion.h),
// so every failure goes through this one function.
ExitCode ExitCodeForStatus(const grpc::Status& status);

// "INVALID_ARGUMENT", "UNAVAILABLE", ... as gRPC spells them.
std::string GrpcCodeName(grpc::StatusCode code);

// The help text's "Exit codes:" paragraph.
const char* ExitCodesHelp();

}  // namespace memest::cli

#endif  // MEMEST_CLIENT_CLI_EXIT_CODES_H_
