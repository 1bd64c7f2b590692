// ApiError: an error answered in OpenAI's shape, {"error": {"message", "type", "param", "code"}}.
#pragma once

#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace kvlm::server {

// Thrown while a request is validated, caught at the handler's edge and sent with its status.
// (Exceptions stay inside the server module: the engine's API answers with Status.)
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), type(std::move(type)), param(std::move(param)),
        code(std::move(code)) {}

  int status;
  std::string type;   // invalid_request_error, authentication_error, not_found_error, ...
  std::string param;  // the request field at fault, "" when none
  std::string code;   // e.g. context_length_exceeded, "" when none

  nlohmann::json to_json() const {
    nlohmann::json error = {{"message", what()}, {"type", type}};
    error["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    error["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
    return {{"error", error}};
  }
};

inline ApiError invalid_request(std::string message, std::string param = {}, std::string code = {}) {
  return ApiError(400, std::move(message), "invalid_request_error", std::move(param), std::move(code));
}

}  // namespace kvlm::server
