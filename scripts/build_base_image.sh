#!/usr/bin/env bash
# Build (once) the offline base sandbox image and print its tag; the recipe lives in the
# package (sandboxes/base_image.sh) so an installed harnessrl computes the same tag.
exec "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../sandboxes/base_image.sh" "$@"
