// cluster/service/client.h — the fleet service's HTTP client: what `loom fleet submit`,
// `status`, `logs`, `pools`, `events` and `cancel` send to a running `loom fleet serve`.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace httplib {
class Client;
}

namespace loom::service {

class Client {
 public:
  // `server` (http://HOST:PORT) and `token` (the bearer token the daemon was given); each
  // empty one comes from $LOOM_FLEET_SERVER / $LOOM_FLEET_TOKEN, and the server then from
  // the default, http://127.0.0.1:8470. Throws loom::Error on an address that is not one.
  Client(std::string server, std::string token);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The answer's JSON body. A service that cannot be reached, an answer of HTTP 400 or
  // more (with the service's own error text) or a body that is not JSON: loom::Error,
  // the first starting "cannot reach" (kUnreachable).
  nlohmann::json get(const std::string& path);
  nlohmann::json post(const std::string& path, const nlohmann::json& body, int* status = nullptr);

  static constexpr const char* kUnreachable = "cannot reach";

 private:
  std::string server_, token_;
  std::unique_ptr<httplib::Client> client_;
};

}  // namespace loom::service
