// The webhook's Planner (webhook/admission.h): memest's plan flags, as `memest plan` reads them,
// planned by a memest-server (or in this process) through the CLI's backend.
#ifndef MEMEST_WEBHOOK_PLANNER_H_
#define MEMEST_WEBHOOK_PLANNER_H_

#include <memory>
#include <string>

#include "client/cli/backend.h"
#include "webhook/admission.h"

namespace memest::webhook {

// Plans with `backend` (shared by the server's threads: the backends are thread-safe). Flags that
// would change where memest runs, or that read files, are refused as bad arguments unless
// `model_dir` is set and the file lies under it.
Planner MakePlanner(std::shared_ptr<cli::Backend> backend, std::string model_dir);

}  // namespace memest::webhook

#endif  // MEMEST_WEBHOOK_PLANNER_H_
