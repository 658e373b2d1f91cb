#include "cluster/service/client.h"

#include <httplib.h>

#include <cstdlib>

#include "core/error.h"

namespace loom::service {

namespace {

std::string from_environment(std::string given, const char* variable) {
  if (given.empty())
    if (const char* value = std::getenv(variable))
      given = value;
  return given;
}

}  // namespace

Client::Client(std::string server, std::string token)
    : server_(from_environment(std::move(server), "LOOM_FLEET_SERVER")),
      token_(from_environment(std::move(token), "LOOM_FLEET_TOKEN")) {
  if (server_.empty())
    server_ = "http://127.0.0.1:8470";
  while (!server_.empty() && (server_.back() == '/' || server_.back() == '\n'))
    server_.pop_back();
  client_ = std::make_unique<httplib::Client>(server_);
  check(client_->is_valid(), "--server '" + server_ + "' is not an http://HOST:PORT address");
  client_->set_connection_timeout(5);
  client_->set_read_timeout(90);
}

Client::~Client() = default;

namespace {

httplib::Headers headers_with(const std::string& token) {
  return token.empty() ? httplib::Headers{}
                       : httplib::Headers{{"Authorization", "Bearer " + token}};
}

nlohmann::json answer_of(const httplib::Result& r, const std::string& server, int* status) {
  check(static_cast<bool>(r), std::string(Client::kUnreachable) + " the fleet service at " +
                                  server + " (" + httplib::to_string(r.error()) +
                                  "); is loom fleet serve running?");
  nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
  if (status)
    *status = r->status;
  if (r->status >= 400)
    throw Error("fleet service: " + (body.is_object() && body.contains("error")
                                         ? body["error"].get<std::string>()
                                         : "HTTP " + std::to_string(r->status)));
  check(!body.is_discarded(), "fleet service: the answer is not JSON");
  return body;
}

}  // namespace

nlohmann::json Client::get(const std::string& path) {
  return answer_of(client_->Get(path, headers_with(token_)), server_, nullptr);
}

nlohmann::json Client::post(const std::string& path, const nlohmann::json& body, int* status) {
  return answer_of(
      client_->Post(path, headers_with(token_),
                    body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                    "application/json"),
      server_, status);
}

}  // namespace loom::service
