// Syntax tree of a parsed Jinja template.
//
// One node type with a kind tag keeps the tree small and the evaluator a
// single switch. What each field means depends on the kind:
//
//   kind            text        a          b          c      list           body / alternate
//   kProgram                                                                body
//   kText           the text
//   kIf                         test                                        then / else
//   kFor                        target     iterable                         body / else
//   kSet                        target     value|null                       body (block set)
//   kMacro          name                                     parameters     body
//   kCallBlock                  call                         caller params  body
//   kFilterBlock                filter                                      body
//   kInteger/kFloat (number)
//   kString         the string
//   kArray/kTuple                                            items
//   kObject                                                  k0,v0,k1,v1..
//   kIdentifier     name
//   kMember                     object     property          (flag: computed, i.e. [..])
//   kSlice                      start?     stop?      step?
//   kCall                       callee                       arguments
//   kKeywordArg     name        value
//   kSpread / kKeywordSpread    operand
//   kBinary         operator    left       right
//   kUnary          operator    operand
//   kFilter                     operand    filter (kIdentifier or kCall)
//   kTest           test name   operand                      (flag: negated)
//   kSelect                     value      condition          (`x if c` without else)
//   kTernary                    condition  if-true    if-false
//
// Every node records the byte offset of its first token in the source.
//
// Thread-safety: immutable after parsing; shared freely between renders.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::text::jinja {

enum class NodeKind : uint8_t {
  kProgram,
  kText,
  kComment,
  kIf,
  kFor,
  kSet,
  kMacro,
  kCallBlock,
  kFilterBlock,
  kBreak,
  kContinue,
  kInteger,
  kFloat,
  kString,
  kArray,
  kTuple,
  kObject,
  kIdentifier,
  kMember,
  kSlice,
  kCall,
  kKeywordArg,
  kSpread,
  kKeywordSpread,
  kBinary,
  kUnary,
  kFilter,
  kTest,
  kSelect,
  kTernary,
};

struct Node;
using NodePtr = std::unique_ptr<Node>;

struct Node {
  NodeKind kind;
  int32_t offset = 0;
  int depth = 1;  // height of this subtree, bounded by the parser
  std::string text;
  double number = 0;
  bool flag = false;
  NodePtr a, b, c;
  std::vector<NodePtr> list;
  std::vector<NodePtr> body;
  std::vector<NodePtr> alternate;
};

}  // namespace tessera::text::jinja
