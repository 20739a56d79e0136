// A grpc.health.v1 client for the server tests.
#ifndef MEMEST_TESTS_SERVER_HEALTH_CLIENT_H_
#define MEMEST_TESTS_SERVER_HEALTH_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "grpc/health/v1/health.grpc.pb.h"

namespace memest::testing {

// The serving status `channel`'s server reports for `service` ("" is the whole server), or
// UNKNOWN if the call fails (the status is stored in `*rpc_status` when given).
inline grpc::health::v1::HealthCheckResponse::ServingStatus CheckHealth(
    const std::shared_ptr<grpc::Channel>& channel, const std::string& service,
    grpc::Status* rpc_status = nullptr) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (rpc_status != nullptr) *rpc_status = status;
  return status.ok() ? response.status() : grpc::health::v1::HealthCheckResponse::UNKNOWN;
}

}  // namespace memest::testing

#endif  // MEMEST_TESTS_SERVER_HEALTH_CLIENT_H_
