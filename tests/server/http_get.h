// A plain HTTP/1.0 GET on 127.0.0.1 for the tests of the metrics endpoint.
#ifndef MEMEST_TESTS_SERVER_HTTP_GET_H_
#define MEMEST_TESTS_SERVER_HTTP_GET_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace memest::testing {

// GET http://127.0.0.1:<port><path>: the whole response, headers included ("" on failure).
inline std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

}  // namespace memest::testing

#endif  // MEMEST_TESTS_SERVER_HTTP_GET_H_
