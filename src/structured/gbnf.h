// GBNF grammars (llama.cpp's format, which vLLM's xgrammar backend also takes) → Grammar, for
// llama.cpp's `grammar` field, vLLM's structured_outputs.grammar / guided_grammar and
// `selfserve generate --grammar`.
//
//   root   ::= answer ("," ws answer)*       # rules: name ::= alternatives; `root` starts
//   answer ::= "yes" | "no" | [0-9]{1,3}     # "literals" and [classes] over code points
//   ws     ::= [ \t\n]*
//
// Literals and classes take the escapes \n \r \t \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH; classes ranges
// and ^ negation; `.` is any character; ( ) groups; postfix * + ? {m} {m,} {m,n} {,n}. Names are
// letters, digits, '-' and '_'. Comments run from '#' to the end of the line. A rule ends where the
// next `name ::=` starts, so alternatives may continue on following lines. Errors (undefined rule,
// left recursion, a rule defined twice, no root, bad syntax) name the line and column.
#pragma once
#include <string_view>

#include "common/status.h"
#include "structured/grammar.h"

namespace ss::structured {

Expected<Grammar> gbnf_grammar(std::string_view text, std::string_view root = "root");

}  // namespace ss::structured
