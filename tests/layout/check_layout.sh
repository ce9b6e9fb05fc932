#!/usr/bin/env bash
# check_layout.sh SOURCE_DIR - the module map of docs/ARCHITECTURE.md, checked
# from the sources: every quoted #include of a file under src/ or tools/ names
# a header of its own module, of a module it may depend on (directly or
# through another), or include/rebound.h; no include climbs with "../"; the
# module graph that the includes draw has no cycle; every folder of src/ and
# tools/ is a known module; inside src/session/ and src/memory/ the files
# that include each other or call each other's functions form no cycle. The build enforces the same direction through
# include paths (cmake/RbModule.cmake); this check also catches what a
# transitive include path would let through, and says where.
# tools/commands/ holds commands of the CLI: they may also include app/*.h.
#
# serve/ (the HTTP service, a library beside the library) is checked at the
# level of its files: each file has a rank in SERVE_ORDER, and a file may
# include the headers of, and call the sv_* functions declared by, files of
# its rank or below only, so there is no cycle between its files; a file
# outside serve/ other than a test includes only its face, serve.h.
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$ROOT"

# module -> the modules it may include directly (the rest follows by closure)
declare -A DEPS=(
    [base]=""
    [kvcodec]="base"
    [format]="base kvcodec"
    [model]="base format"
    [memory]="base kvcodec format model"
    [engine]="base format model memory"
    [session]="base kvcodec format model memory engine"
    [analysis]="session"
    [synth]="session"
    [harness]="session"
    [commands]="analysis synth harness"
)
dir_of() { case $1 in analysis|synth|harness|commands) echo "tools/$1" ;; *) echo "src/$1" ;; esac; }

fail=0
err() { echo "check_layout: $*" >&2; fail=1; }

# every folder is a module
for d in src/*/ tools/*/; do
    m=$(basename "$d")
    [ -n "${DEPS[$m]+x}" ] || err "folder $d is not in the module map (docs/ARCHITECTURE.md)"
done
for f in src/*.c src/*.h tools/*.c tools/*.h; do
    [ -e "$f" ] && err "$f lies outside a module folder"
done

# closure of the allowed dependencies
declare -A ALLOWED
closure() {
    local seen=" $1 " todo d
    todo=(${DEPS[$1]})
    while [ ${#todo[@]} -gt 0 ]; do
        d=${todo[0]}; todo=("${todo[@]:1}")
        case $seen in *" $d "*) continue ;; esac
        seen+="$d "
        todo+=(${DEPS[$d]})
    done
    ALLOWED[$1]=$seen
}
for m in "${!DEPS[@]}"; do closure "$m"; done

# tools/commands are commands of the CLI (compiled into it, not into
# rebound_tools): they may also include the CLI's own headers (app/*.h)
ALLOWED[commands]+="app "

# header -> module
declare -A OWNER
for h in app/*.h; do
    [ -e "$h" ] && OWNER[$(basename "$h")]=app
done
for m in "${!DEPS[@]}"; do
    for h in $(dir_of "$m")/*.h; do
        [ -e "$h" ] || continue
        b=$(basename "$h")
        [ -z "${OWNER[$b]+x}" ] || err "header $b exists in two modules: ${OWNER[$b]} and $m"
        OWNER[$b]=$m
    done
done

# the includes; edges of the module graph
declare -A EDGE
n_inc=0
for m in "${!DEPS[@]}"; do
    for f in $(dir_of "$m")/*.[ch]; do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            n_inc=$((n_inc + 1))
            case $inc in
                *../*) err "$f includes \"$inc\": no relative climbing; use the module's include path" ; continue ;;
                rebound.h|rebound_experimental.h) continue ;;  # include/: everyone
            esac
            o=${OWNER[$inc]:-}
            # a kernel file built a second time with other flags includes
            # its source file of the same module (matmul_vnni.c: matmul_avx2.c)
            case $inc in
                *.c) [ -e "$(dir_of "$m")/$inc" ] && continue ;;
            esac
            if [ -z "$o" ]; then
                err "$f includes \"$inc\", which no module holds"
                continue
            fi
            [ "$o" = "$m" ] && continue
            EDGE["$m $o"]=1
            case ${ALLOWED[$m]} in
                *" $o "*) ;;
                *) a=${ALLOWED[$m]#" $m "}
                   err "$f includes \"$inc\" of module $o: $m may use only: ${a:-include/rebound.h}" ;;
            esac
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
done

# no cycle in the drawn graph (depth-first search, three colours)
declare -A COLOUR
visit() {
    local m=$1 e o
    COLOUR[$m]=grey
    for e in "${!EDGE[@]}"; do
        [ "${e%% *}" = "$m" ] || continue
        o=${e#* }
        case ${COLOUR[$o]:-white} in
            grey) err "cycle between modules: $m -> $o -> ... -> $m" ;;
            white) visit "$o" ;;
        esac
    done
    COLOUR[$m]=black
}
for m in "${!DEPS[@]}"; do
    [ "${COLOUR[$m]:-white}" = white ] && visit "$m"
done

# ---- serve/: files in one direction -----------------------------------------
SERVE_ORDER="config metrics convstore scheduler oai http serve"
declare -A SRANK
i=0
for f in $SERVE_ORDER; do SRANK[$f]=$i; i=$((i + 1)); done
n_serve_edges=0
if [ -d serve ]; then
    # function -> the file (stem) whose header declares it
    declare -A SFUNC
    for h in serve/*.h; do
        stem=$(basename "$h" .h)
        for fn in $(grep -o '^[a-z_][a-z0-9_ *]*[ *]\(sv_[a-z0-9_]*\)(' "$h" | grep -o 'sv_[a-z0-9_]*($' | tr -d '('); do
            SFUNC[$fn]=$stem
        done
    done
    for f in serve/*.c serve/*.h; do
        [ -e "$f" ] || continue
        stem=$(basename "$f"); stem=${stem%.*}
        [ -n "${SRANK[$stem]+x}" ] || { err "$f is not in serve's file order ($SERVE_ORDER): add it to check_layout.sh and docs/ARCHITECTURE.md"; continue; }
        r=${SRANK[$stem]}
        while IFS= read -r inc; do
            case $inc in
                rebound.h|rebound_experimental.h) continue ;;
                *../*) err "$f includes \"$inc\": no relative climbing"; continue ;;
            esac
            o=${inc%.h}
            if [ ! -e "serve/$inc" ] || [ -z "${SRANK[$o]+x}" ]; then
                err "$f includes \"$inc\", which is not a header of serve/ (serve uses only include/ and its own files)"
                continue
            fi
            [ "$o" = "$stem" ] && continue
            n_serve_edges=$((n_serve_edges + 1))
            [ "${SRANK[$o]}" -le "$r" ] || err "$f includes \"$inc\": $stem may use only the files before it in $SERVE_ORDER"
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
        case $f in *.c) ;; *) continue ;; esac
        # calls: every sv_* function used, by the file that declares it
        for fn in $(sed 's://.*$::; s:/\*.*\*/::g' "$f" | grep -o '\bsv_[a-z0-9_]*(' | tr -d '(' | sort -u); do
            o=${SFUNC[$fn]:-}
            [ -n "$o" ] || continue   # static in this file
            [ "$o" = "$stem" ] && continue
            [ "${SRANK[$o]}" -le "$r" ] || err "$f calls $fn of serve/$o.h: calls in serve/ go down $SERVE_ORDER"
        done
    done
    # outside serve/: the CLI includes only the face
    for f in app/*.c app/*.h bench/*.c bench/*/*.c tools/*/*.c; do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            [ -e "serve/$inc" ] || continue
            [ "$inc" = serve.h ] || err "$f includes serve/$inc: outside serve/ only its face, serve.h"
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
fi

# Inside src/session/ and src/memory/: no cycle between files. A unit is a
# file's name without .c/.h (session_memory.c and session_memory.h are one);
# unit A -> B when A includes B's header or calls a function B's .c defines
# (an rb_* name at the start of a definition line). Calls through function
# pointers are not seen here; the check after this one lists them.
declare -A FEDGE FDEF FCOLOUR
fvisit() {
    local u=$1 e o
    FCOLOUR[$u]=grey
    for e in "${!FEDGE[@]}"; do
        [ "${e%% *}" = "$u" ] || continue
        o=${e#* }
        case ${FCOLOUR[$o]:-white} in
            grey) err "cycle between files of $FDIR: $u -> $o -> ... -> $u (${FEDGE[$e]})" ;;
            white) fvisit "$o" ;;
        esac
    done
    FCOLOUR[$u]=black
}
n_fedges=0
for FDIR in src/session src/memory; do
    FEDGE=(); FDEF=(); FCOLOUR=()
    for f in "$FDIR"/*.c; do
        u=$(basename "$f" .c)
        while IFS= read -r name; do
            FDEF[$name]=$u
        done < <(grep -E '^[A-Za-z_].*[ *]rb_[a-z0-9_]+\(' "$f" | grep -vE ';[[:space:]]*$' |
                 sed -E 's/^[^(]*[ *](rb_[a-z0-9_]+)\(.*/\1/')
    done
    for f in "$FDIR"/*.[ch]; do
        u=$(basename "$f"); u=${u%.[ch]}
        while IFS= read -r inc; do
            [ -e "$FDIR/$inc" ] || continue
            o=${inc%.[ch]}
            [ "$o" = "$u" ] || FEDGE["$u $o"]="$(basename "$f") includes $inc"
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
        case $f in *.c) ;; *) continue ;; esac
        while IFS= read -r name; do
            o=${FDEF[$name]:-}
            [ -n "$o" ] && [ "$o" != "$u" ] && [ -z "${FEDGE["$u $o"]+x}" ] &&
                FEDGE["$u $o"]="$(basename "$f") calls $name"
        done < <(grep -oE '\brb_[a-z0-9_]+[[:space:]]*\(' "$f" | sed -E 's/[[:space:]]*\($//' | sort -u)
    done
    n_fedges=$((n_fedges + ${#FEDGE[@]}))
    if [ -n "${CHECK_LAYOUT_VERBOSE:-}" ]; then # the file graph, for docs/ARCHITECTURE.md
        for e in "${!FEDGE[@]}"; do echo "$FDIR: ${e% *} -> ${e#* } (${FEDGE[$e]})"; done | sort
    fi
    for u in $(for f in "$FDIR"/*.[ch]; do b=$(basename "$f"); echo "${b%.[ch]}"; done | sort -u); do
        [ "${FCOLOUR[$u]:-white}" = white ] && fvisit "$u"
    done
done

# Calls up through function pointers, which the include and call graphs
# above cannot see: src/session/ is the top of the library, so a function
# of it handed out as a value (a callback, a field set to it) is called by
# the module it is given to - below, or a thread. Each remaining one is
# listed here with who calls it; any other fails. (The memory pool's trim
# callback into session_memory.c went this way; the pool now trims the
# member's residency itself.) Comments are stripped by the C preprocessor.
declare -A CALLBACK_OK=(
    [session_memory.c:layer_gate]="engine's forward pass, before each layer"
    [session_memory.c:rows_gate]="engine's forward pass, the embedding rows (weight stream)"
    [session_file.c:read_saved]="memory/residency, reading a page from the session file"
    [session_file.c:read_saved_run]="memory/residency, reading a layer's consecutive pages in one request"
    [session_file.c:pin_get]="format/sessfile, the pages a save writes"
    [session_file.c:pin_put]="format/sessfile"
    [session_file.c:snap_get]="format/sessfile, the pages a compaction writes"
    [session_file.c:snap_put]="format/sessfile"
    [session_file.c:worker_commit]="session_writer's thread (same folder)"
    [session_writer.c:writer_main]="pthread_create"
    [session_multi.c:cmp_session]="qsort"
)
n_callbacks=0
CPP=${CC:-cc}
if command -v "$CPP" >/dev/null 2>&1; then
    for f in src/session/*.c; do
        b=$(basename "$f")
        code=$("$CPP" -fpreprocessed -dD -E -P "$f" 2>/dev/null) || { err "$f: the preprocessor could not strip its comments"; continue; }
        for fn in $(printf '%s\n' "$code" | grep -E '^(static )?[A-Za-z_][A-Za-z0-9_ *]*[ *][a-z_][a-z0-9_]*\(' |
                    grep -vE ';[[:space:]]*$' | sed -E 's/^[^(]*[ *]([a-z_][a-z0-9_]*)\(.*/\1/' | sort -u); do
            # a use that is neither a call nor the definition: the function as a value
            uses=$(printf '%s\n' "$code" | grep -E "(^|[^A-Za-z0-9_.>])$fn([^A-Za-z0-9_(]|\$)" |
                   grep -vE "^(static )?[A-Za-z_][A-Za-z0-9_ *]*[ *]$fn\(" || true)
            [ -n "$uses" ] || continue
            n_callbacks=$((n_callbacks + 1))
            [ -n "${CALLBACK_OK[$b:$fn]+x}" ] ||
                err "$f hands out $fn as a function pointer: a call back up into src/session/ (calls go down; if it must stay, list it in check_layout.sh's CALLBACK_OK with its caller)"
        done
    done
else
    n_callbacks="(not checked: no C preprocessor $CPP)"
fi

if [ $fail -ne 0 ]; then
    echo "check_layout: FAILED (the map: docs/ARCHITECTURE.md)"
    exit 1
fi
echo "check_layout: ${#DEPS[@]} modules, ${#EDGE[@]} module edges from $n_inc includes, no cycle, every include in the direction of the map; $n_fedges file edges in src/session and src/memory, no cycle; $n_callbacks functions of src/session handed out as pointers, each listed; serve/: $n_serve_edges file includes in the order $SERVE_ORDER"
