#!/usr/bin/env bash
# Session 29, call 3: call2.sh's idle-spin A/B again, the GGUF's part p02, the other order, its own seeds.
CALL=3 exec bash "$(dirname "$0")/call2.sh"
