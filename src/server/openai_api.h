// The OpenAI-compatible API as pure functions, by concern: request parsing (request_parse.h),
// structured-output parameters (structured_params.h), response and chunk building (responses.h),
// over the plain data of api_types.h. The HTTP layer (server.cpp) and the per-choice streams
// (choice_stream.h) use them; tests and the fuzzer include this header.
#pragma once
#include "server/api_types.h"
#include "server/request_parse.h"
#include "server/responses.h"
#include "server/structured_params.h"
