# Sourced by the local scripts (demo.sh, test.sh, stack.sh, models.sh, phoenix.sh), after they set
# LOCAL_DIR: what the tools they run would cache in your home folder goes into .local/cache instead, so
# that `rm -rf .local` takes it all.
#   XDG_CACHE_HOME            pip's cache (.local/cache/pip) and any other tool that follows XDG
#                             (default ~/.cache)
#   npm_config_cache          npm's cache, for `npm ci` of the TB-Backend service (default ~/.npm)
#   npm_config_update_notifier=false
#                             npm asks its registry for a newer npm and prints a notice: not a question
#                             for this project
#   ORT_DISABLE_TELEMETRY=1   ONNX Runtime (the worker's embedder, and the Python one that builds the
#                             model) otherwise writes a device id and an event queue to
#                             ~/.cache/Microsoft/DeveloperTools/.onnxruntime and tries to send them
# Phoenix's pid folder (.arize-phoenix in the system temp folder) goes into .local/phoenix/tmp: demo.sh
# sets TMPDIR for it; the tests' Phoenix runs in the tests' own temp folder.
mkdir -p -- "$LOCAL_DIR/cache"
XDG_CACHE_HOME="$(cd -- "$LOCAL_DIR/cache" && pwd -P)"
export XDG_CACHE_HOME
export npm_config_cache="$XDG_CACHE_HOME/npm"
export npm_config_update_notifier=false
export ORT_DISABLE_TELEMETRY=1
