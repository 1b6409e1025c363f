#!/usr/bin/env bash
# Chat with a companion after the demo, as the demo user jess: starts what is not running (the stack, the
# scripted model without OPENROUTER_API_KEY, a worker) and opens the chat; piped, it reads your lines from
# stdin and prints each reply.
#
#   deploy/local/chat.sh                     chat with Kaori (BOT=tony|rico|max|zoe for another companion)
#   deploy/local/chat.sh --group kaori,tony  a group chat
#   echo "any parks in portland?" | deploy/local/chat.sh
exec "$(dirname -- "${BASH_SOURCE[0]}")/demo.sh" --chat "$@"
