#include "cluster/service/http_api.h"

#include <httplib.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/service/attempts.h"
#include "cluster/service/service.h"
#include "core/error.h"

namespace loom::service {

namespace {

constexpr std::size_t kMaxBody = 1 << 20;         // a job request: 1 MiB at most
constexpr std::size_t kMaxLogChunk = 256 * 1024;  // bytes of log per request

void reply(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  // Bytes that are not UTF-8 (a job's log, a file name) are replaced, not thrown on.
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void refuse(httplib::Response& res, int status, const std::string& message) {
  reply(res, status, {{"error", message}});
}

bool loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

std::int64_t id_of(const httplib::Request& req) {
  return std::stoll(req.matches[1].str());  // the route's pattern admits digits only
}

}  // namespace

struct HttpApi::Impl {
  Service& service;
  ApiOptions options;
  httplib::Server server;
  int bound_port = 0;

  Impl(Service& s, ApiOptions o) : service(s), options(std::move(o)) {}

  bool authorized(const httplib::Request& req) const {
    if (options.token.empty())
      return true;
    if (req.get_header_value("Authorization") == "Bearer " + options.token)
      return true;
    return req.has_param("token") && req.get_param_value("token") == options.token;
  }

  void routes() {
    server.set_payload_max_length(kMaxBody);
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (authorized(req))
        return httplib::Server::HandlerResponse::Unhandled;
      refuse(res, 401, "a bearer token is required (Authorization: Bearer TOKEN)");
      return httplib::Server::HandlerResponse::Handled;
    });
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr e) {
          try {
            std::rethrow_exception(e);
          } catch (const BadRequest& bad) {
            refuse(res, bad.status, bad.what());
          } catch (const std::exception& other) {
            refuse(res, 500, std::string("internal error: ") + other.what());
          }
        });
    server.Get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(status_page_html(), "text/html; charset=utf-8");
    });
    server.Get("/api/health", [this](const httplib::Request&, httplib::Response& res) {
      reply(res, 200, {{"ok", true}, {"pools", service.pools().size()}});
    });
    server.Post("/api/jobs", [this](const httplib::Request& req, httplib::Response& res) {
      nlohmann::json body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_discarded())
        throw BadRequest(400, "request body: not valid JSON (a job object expected)");
      if (body.is_object() && !body.contains("idempotency_key") &&
          req.has_header("Idempotency-Key"))
        body["idempotency_key"] = req.get_header_value("Idempotency-Key");
      JobSpec spec = JobSpec::from_json(body, "job");
      service.check_submittable(spec);
      Store::Submitted s = service.store().submit(spec, wall_seconds());
      service.wake();
      reply(res, s.created ? 201 : 200, {{"id", s.id}, {"created", s.created}});
    });
    server.Get("/api/jobs", [this](const httplib::Request&, httplib::Response& res) {
      nlohmann::json jobs = nlohmann::json::array();
      for (const JobRecord& j : service.store().jobs())
        jobs.push_back(j.to_json());
      reply(res, 200, {{"jobs", jobs}});
    });
    server.Get(R"(/api/jobs/(\d{1,15}))",
               [this](const httplib::Request& req, httplib::Response& res) {
                 std::optional<JobRecord> job = service.store().job(id_of(req));
                 if (!job)
                   return refuse(res, 404, "no job " + req.matches[1].str());
                 nlohmann::json j = job->to_json();
                 j["attempt_list"] = nlohmann::json::array();
                 for (const AttemptRecord& a : service.store().attempts(job->id))
                   j["attempt_list"].push_back(a.to_json());
                 j["curve"] = service.loss_curve(job->id);
                 reply(res, 200, j);
               });
    server.Get(R"(/api/jobs/(\d{1,15})/curve)",
               [this](const httplib::Request& req, httplib::Response& res) {
                 reply(res, 200, {{"curve", service.loss_curve(id_of(req))}});
               });
    server.Post(R"(/api/jobs/(\d{1,15})/cancel)",
                [this](const httplib::Request& req, httplib::Response& res) {
                  if (!service.store().request_cancel(id_of(req), wall_seconds()))
                    return refuse(res, 404, "no job " + req.matches[1].str());
                  service.wake();
                  reply(res, 200, {{"ok", true}});
                });
    server.Get(
        R"(/api/jobs/(\d{1,15})/log)", [this](const httplib::Request& req, httplib::Response& res) {
          std::optional<JobRecord> job = service.store().job(id_of(req));
          if (!job)
            return refuse(res, 404, "no job " + req.matches[1].str());
          std::int64_t attempt = job->attempts, offset = 0;
          try {
            if (req.has_param("attempt"))
              attempt = std::stoll(req.get_param_value("attempt"));
            if (req.has_param("offset"))
              offset = std::stoll(req.get_param_value("offset"));
          } catch (const std::exception&) {
            return refuse(res, 400, "log: attempt and offset must be integers");
          }
          if (attempt < 1 || attempt > job->attempts || offset < 0)
            return refuse(res, 400,
                          "log: attempt " + std::to_string(attempt) + " is not in [1, " +
                              std::to_string(job->attempts) + "], or offset < 0");
          std::ifstream in(AttemptFiles{service.job_dir(job->id), attempt}.log(), std::ios::binary);
          std::string text;
          if (in.good()) {
            in.seekg(offset);
            text.resize(kMaxLogChunk);
            in.read(text.data(), static_cast<std::streamsize>(text.size()));
            text.resize(static_cast<std::size_t>(in.gcount()));
          }
          const bool finished = job->state == "succeeded" || job->state == "failed" ||
                                job->state == "cancelled" || job->state == "unplaceable";
          reply(res, 200,
                {{"attempt", attempt},
                 {"offset", offset + static_cast<std::int64_t>(text.size())},
                 {"text", text},
                 {"last_attempt", attempt == job->attempts},
                 {"finished", finished}});
        });
    server.Get("/api/pools", [this](const httplib::Request&, httplib::Response& res) {
      reply(res, 200, {{"pools", service.pools_json()}});
    });
    server.Post(R"(/api/pools/([A-Za-z0-9_.\-]{1,64})/(drain|undrain))",
                [this](const httplib::Request& req, httplib::Response& res) {
                  const std::string name = req.matches[1].str();
                  bool known = false;
                  for (const PoolSpec& p : service.pools())
                    known = known || p.name == name;
                  if (!known)
                    return refuse(res, 404, "no pool '" + name + "'");
                  service.store().set_draining(name, req.matches[2].str() == "drain",
                                               wall_seconds());
                  service.wake();
                  reply(res, 200, {{"ok", true}});
                });
    server.Get("/api/events", [this](const httplib::Request& req, httplib::Response& res) {
      std::int64_t after = 0;
      double wait = 0;
      try {
        if (req.has_param("after"))
          after = std::stoll(req.get_param_value("after"));
        if (req.has_param("wait"))
          wait = std::stod(req.get_param_value("wait"));
      } catch (const std::exception&) {
        return refuse(res, 400, "events: after must be an integer and wait a number of seconds");
      }
      if (!(wait >= 0 && wait <= 60))
        return refuse(res, 400, "events: wait must be in [0, 60] seconds");
      // Long poll: answer as soon as there are events, or when the wait is over.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait);
      std::vector<EventRecord> events;
      for (;;) {
        events = service.store().events_after(after);
        if (!events.empty() || std::chrono::steady_clock::now() >= deadline)
          break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      nlohmann::json list = nlohmann::json::array();
      for (const EventRecord& e : events)
        list.push_back(e.to_json());
      reply(res, 200, {{"events", list}});
    });
  }
};

HttpApi::HttpApi(Service& service, ApiOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(options))) {
  check(loopback(impl_->options.host) || !impl_->options.token.empty(),
        "fleet serve: --listen " + impl_->options.host +
            " is not the loopback address; give --token (or LOOM_FLEET_TOKEN) so that "
            "every request must carry it");
  impl_->routes();
}

HttpApi::~HttpApi() = default;

void HttpApi::bind() {
  const bool ok =
      impl_->options.port == 0
          ? (impl_->bound_port = impl_->server.bind_to_any_port(impl_->options.host)) > 0
          : impl_->server.bind_to_port(impl_->options.host, impl_->options.port);
  check(ok, "fleet serve: cannot listen on " + impl_->options.host + ":" +
                std::to_string(impl_->options.port) + " (in use, or not an address of this host)");
  if (impl_->options.port != 0)
    impl_->bound_port = impl_->options.port;
}

void HttpApi::serve() {
  impl_->server.listen_after_bind();
}

void HttpApi::stop() {
  impl_->server.stop();
}

int HttpApi::port() const {
  return impl_->bound_port;
}

}  // namespace loom::service
