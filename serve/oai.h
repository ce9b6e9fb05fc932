/*
 * oai.h - the OpenAI JSON of `rebound serve`: a request body into an
 * sv_request, and an sv_request's output into responses, stream chunks
 * and error objects. Pure functions over their arguments (jansson inside),
 * no I/O, no state: any thread.
 *
 * A field the service does not know is refused by name (never silently
 * ignored: the KNOWN list in oai.c); a known field of a wrong
 * type or value is refused with a message that names it (and its index in
 * an array). Every string returned is compact JSON, malloc'ed: the caller
 * frees it; NULL means out of memory.
 *
 * To add a request field: name it in KNOWN and parse it in parse_fields
 * (oai.c) into a field
 * of sv_request above its `mu` (scheduler.h), and use it in the scheduler.
 * To add a response field: full_response / chunk in oai.c.
 */
#ifndef RB_SERVE_OAI_H
#define RB_SERVE_OAI_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "scheduler.h"

/* Why a request was refused: an HTTP status, the field (NULL: the body as
 * a whole), the message. */
typedef struct sv_oai_error {
    sv_err e;
    const char *param;            /* static, or param_buf */
    char param_buf[64];           /* an unknown field's name */
    char msg[400];
} sv_oai_error;

/* Parses body[0..len) (a JSON object) into r, a fresh sv_request: its kind
 * (SV_CHAT or SV_COMPLETION) and the fields the endpoint takes; defaults
 * from cfg (sampler, n_predict); max_tokens up to n_ctx. 0, or -1 with
 * *err filled (r then holds what was parsed so far; release it). */
int sv_oai_parse(const sv_config *cfg, uint32_t n_ctx, sv_kind kind, const char *body, size_t len,
                 sv_request *r, sv_oai_error *err);

/* What every response object carries besides the request's output. */
typedef struct sv_oai_meta {
    const char *id;               /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;              /* Unix seconds */
    const char *model;            /* /v1/models id */
} sv_oai_meta;

/* {"error": {"message", "type", "param", "code"}} */
char *sv_oai_error_json(sv_err e, const char *msg, const char *param);
/* The whole reply of a done request (chat.completion / text_completion). */
char *sv_oai_response(const sv_request *r, const sv_oai_meta *m);
/* One stream chunk of a started request: delta text (NULL: none), finish
 * reason (NULL: none), the assistant role (role != 0; chat only). */
char *sv_oai_chunk(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                   const char *finish, int role);
/* A text chunk with the logprobs of r->lps[lp0..lp1) (call with r->mu
 * held), or with calls: the whole reply as tool calls (or its text when it
 * has none), once the request is done. */
char *sv_oai_chunk_ex(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                      size_t lp0, size_t lp1, int calls);
/* The last chunk of a stream with stream_options.include_usage. */
char *sv_oai_usage_chunk(const sv_request *r, const sv_oai_meta *m);
/* GET /v1/models: the one model. */
char *sv_oai_models(const char *model, uint32_t n_ctx, int64_t created);
/* The finish_reason a client sees ("cancelled" is reported as "stop";
 * "tool_calls" when a reply with tools holds parsed calls). */
const char *sv_oai_finish_name(const sv_request *r);

/* A utility's body (POST /tokenize {"content", "add_special",
 * "with_pieces"}, /detokenize {"tokens"}, /apply-template {"messages",
 * "tools", "tool_choice"}, /v1/chat/completions/input_tokens (a chat
 * request: {"object": "response.input_tokens", "input_tokens": N}),
 * /v1/embeddings {"input": string | [string] | [int] | [[int]],
 * "encoding_format": "float" | "base64", "model"}) into r (kind set). As
 * sv_oai_parse. */
int sv_oai_parse_utility(sv_kind kind, const char *body, size_t len, sv_request *r,
                         sv_oai_error *err);
/* A done utility's reply: llama-server's shapes ({"tokens"}, {"content"},
 * {"prompt"}); OpenAI's list of embeddings (model: its id). */
char *sv_oai_utility_response(const sv_request *r, const char *model);

/* Valid UTF-8 of s[0..n): invalid bytes become U+FFFD; malloc'ed, NUL
 * ended, its length in *out_n. */
char *sv_oai_utf8_clean(const char *s, size_t n, size_t *out_n);

#endif
