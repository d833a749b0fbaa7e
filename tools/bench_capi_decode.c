/* The C ABI's decode throughput from C: the same run as tools/bench_engine_decode.cpp (the C++
 * engine driven directly) and go/tools/benchdecode (the Go SDK), so that docs/perf/go.md can tell
 * the library's cost from the Go runtime's.
 *   bench_capi_decode MODEL N MAX_TOKENS THREADS OWN_THREAD [LINGER_US [cpu|cuda]] */
#define _POSIX_C_SOURCE 200809L
#include <selfserve.h>

#include <dirent.h>
#include <sys/resource.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  timespec_get(&ts, TIME_UTC);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* CPU time (s) of this process's threads other than the engine's (ss-engine, ss-cpu): the caller's
 * side of the boundary. */
static double caller_cpu(void) {
  double total = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  struct dirent* t;
  while ((t = readdir(d)) != NULL) {
    if (t->d_name[0] == '.') continue;
    char path[320], comm[64] = {0};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
    fclose(f);
    if (strncmp(comm, "ss-engine", 9) == 0 || strncmp(comm, "ss-cpu", 6) == 0) continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/schedstat", t->d_name);
    f = fopen(path, "r");
    if (!f) continue;
    unsigned long long ns = 0; /* schedstat's first field: nanoseconds on a CPU */
    if (fscanf(f, "%llu", &ns) == 1) total += (double)ns * 1e-9;
    fclose(f);
  }
  closedir(d);
  return total;
}

int main(int argc, char** argv) {
  if (argc < 6 || argc > 8) {
    fprintf(stderr, "usage: bench_capi_decode MODEL N MAX_TOKENS THREADS OWN_THREAD\n");
    return 2;
  }
  const int n = atoi(argv[2]), max_tokens = atoi(argv[3]);
  ss_model_options mo;
  ss_model_options_init(&mo);
  mo.path = argv[1];
  ss_model* m = NULL;
  ss_engine* e = NULL;
  ss_engine_options eo;
  ss_engine_options_init(&eo);
  eo.device = SS_DEVICE_CPU;
  eo.threads = atoi(argv[4]);
  eo.own_thread = atoi(argv[5]);
  eo.poll_linger_us = argc >= 7 ? atoi(argv[6]) : 0;
  if (argc == 8 && strcmp(argv[7], "cuda") == 0) {
    eo.device = SS_DEVICE_CUDA;
    eo.kv_cache_mib = 0; /* sized from the GPU's memory */
  }
  if (ss_model_load(&mo, &m) != SS_OK || ss_engine_create(m, &eo, &e) != SS_OK) {
    fprintf(stderr, "%s\n", ss_last_error()->message);
    return 1;
  }
  int* got = calloc((size_t)n, sizeof(int));
  const double cpu0 = caller_cpu();
  for (int i = 0; i < n; ++i) {
    ss_request_options o;
    ss_request_options_init(&o);
    o.prompt = "The history of the printing press";
    o.max_tokens = max_tokens;
    o.temperature = 0;
    o.ignore_eos = 1;
    o.user_data = (uint64_t)i;
    uint64_t id;
    if (ss_engine_submit(e, &o, &id) != SS_OK) {
      fprintf(stderr, "%s\n", ss_last_error()->message);
      return 1;
    }
  }
  ss_event ev[256];
  long long tokens = 0;
  int firsts = 0, open = n;
  double all_first = 0, last = 0;
  while (open > 0) {
    size_t count = 0;
    if (ss_engine_poll(e, ev, sizeof(ss_event), 256, &count, 100) != SS_OK) {
      fprintf(stderr, "%s\n", ss_last_error()->message);
      return 1;
    }
    const double t = now_s();
    for (size_t i = 0; i < count; ++i) {
      if (ev[i].token >= 0) {
        ++tokens;
        last = t;
        if (got[ev[i].user_data]++ == 0 && ++firsts == n) all_first = t;
      }
      if (ev[i].finish) --open;
    }
  }
  const double caller_secs = caller_cpu() - cpu0;
  ss_metrics mt;
  mt.struct_size = sizeof mt;
  ss_engine_metrics(e, &mt);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("{\"impl\":\"c%s%s\",\"n\":%d,\"tokens\":%lld,\"decode_tok_s\":%.2f,\"decode_step_ms\":%.3f,\"ctx_switches\":%ld,\"caller_cpu_us_tok\":%.3f}\n",
         eo.own_thread ? "-own-thread" : "", eo.poll_linger_us ? "-linger" : "", n, tokens, (tokens - n) / (last - all_first),
         mt.decode_steps ? 1e3 * mt.decode_step_seconds / (double)mt.decode_steps : 0.0, ru.ru_nvcsw + ru.ru_nivcsw, caller_secs * 1e6 / (double)tokens);
  free(got);
  ss_engine_free(e);
  ss_model_free(m);
  return 0;
}
