// handle_generation: POST /v1/completions and /v1/chat/completions — validate, build the prompt
// (the chat template for chat), submit the choices, and answer as JSON or Server-Sent Events.
#pragma once

#include "server/api_server.h"

namespace kvlm::server {

// Throws ApiError for errors found before the response starts; later ones go in the body
// (in-band `data: {"error": ...}` for streams).
void handle_generation(ApiServer& server, Endpoint endpoint, const httplib::Request& req, httplib::Response& res);

}  // namespace kvlm::server
