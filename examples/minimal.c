/*
 * minimal.c - the smallest program against the installed librebound: opens
 * a GGUF model, prints what it is and what it costs in memory, closes it.
 * Uses only the public API (<rebound.h>).
 *
 * Build against an installed rebound:
 *   cc minimal.c -o minimal $(pkg-config --cflags --libs rebound)
 * or with CMake: cmake -S examples -B build-examples && cmake --build build-examples
 *
 * Run:  ./minimal MODEL.gguf
 * Exit: 0 on success, 1 if the model cannot be opened, 2 on bad usage.
 */
#include <inttypes.h>
#include <stdio.h>

#include <rebound.h>

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }

    rb_model *model = NULL;
    rb_error err;
    rb_status st = rb_model_open(argv[1], NULL, &model, &err);
    if (st != RB_OK) {
        fprintf(stderr, "minimal: %s: %s\n", rb_status_name(err.status), err.message);
        return 1;
    }

    rb_model_info info;
    st = rb_model_get_info(model, &info);
    if (st != RB_OK) {
        fprintf(stderr, "minimal: %s: %s\n", rb_status_name(st), rb_model_errmsg(model));
        rb_model_close(model);
        return 1;
    }
    printf("architecture        %s\n", info.architecture);
    printf("layers              %" PRIu32 "\n", info.n_layers);
    printf("weight bytes        %" PRIu64 "\n", info.tensor_data_bytes);
    printf("KV bytes per token  %" PRIu64 "\n", info.kv_bytes_per_token);

    rb_model_close(model);
    return 0;
}
