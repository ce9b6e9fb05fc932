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
)
dir_of() { case $1 in analysis|synth|harness) echo "tools/$1" ;; *) echo "src/$1" ;; esac; }

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

# header -> module
declare -A OWNER
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

# Inside src/session/ and src/memory/: no cycle between files. A unit is a
# file's name without .c/.h (session_memory.c and session_memory.h are one);
# unit A -> B when A includes B's header or calls a function B's .c defines
# (an rb_* name at the start of a definition line). Calls through function
# pointers are not seen; the folders' file comments say where they remain.
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

if [ $fail -ne 0 ]; then
    echo "check_layout: FAILED (the map: docs/ARCHITECTURE.md)"
    exit 1
fi
echo "check_layout: ${#DEPS[@]} modules, ${#EDGE[@]} module edges from $n_inc includes, no cycle, every include in the direction of the map; $n_fedges file edges in src/session and src/memory, no cycle"
