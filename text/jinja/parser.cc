#include "text/jinja/parser.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace tessera::text::jinja {
namespace {

constexpr const char* kFilters[] = {
    "safe",  "tojson",   "list",       "first",      "last",  "length",  "reverse", "sort",
    "join",  "string",   "unique",     "upper",      "lower", "title",   "capitalize",
    "trim",  "indent",   "int",        "float",      "abs",   "items",   "bool",    "get",
    "keys",  "values",   "dictsort",   "default",    "selectattr",       "rejectattr",
    "map",   "replace",
    // Beyond the reference (which lacks them): Jinja's own semantics.
    "select", "reject", "count", "round",
};
constexpr const char* kTests[] = {
    "boolean", "callable", "odd",     "even",     "false",    "true",    "none",
    "string",  "number",   "integer", "iterable", "mapping",  "sequence", "lower",
    "upper",   "defined",  "undefined", "equalto", "eq",
};

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, absl::string_view source)
      : tokens_(tokens), source_(source) {}

  absl::StatusOr<NodePtr> Run() {
    NodePtr program = NewNode(NodeKind::kProgram, 0);
    while (current_ < tokens_.size()) {
      ASSIGN_OR_RETURN(NodePtr s, ParseAny());
      program->body.push_back(std::move(s));
    }
    return program;
  }

 private:
  // Tracks recursion depth; the parser refuses to go deeper than kMaxNesting.
  class Guard {
   public:
    explicit Guard(Parser* p) : p_(p) { ++p_->nesting_; }
    ~Guard() { --p_->nesting_; }
    // Each level of nesting passes a few guarded functions.
    bool too_deep() const { return p_->nesting_ > 4 * kMaxNesting; }

   private:
    Parser* p_;
  };

  NodePtr NewNode(NodeKind kind, int32_t offset) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->offset = offset;
    return n;
  }
  // Computes the subtree height and refuses trees deeper than kMaxNesting
  // (long operator chains build deep left-leaning trees without recursion).
  absl::StatusOr<NodePtr> Finish(NodePtr n) {
    int d = 0;
    for (const NodePtr* p : {&n->a, &n->b, &n->c}) {
      if (*p) d = std::max(d, (*p)->depth);
    }
    for (const auto* v : {&n->list, &n->body, &n->alternate}) {
      for (const NodePtr& p : *v) d = std::max(d, p->depth);
    }
    n->depth = d + 1;
    if (n->depth > kMaxNesting) {
      return Error(n->offset, absl::StrCat("template nests deeper than ", kMaxNesting, " levels"));
    }
    return n;
  }

  int32_t Offset() const {
    if (current_ < tokens_.size()) return tokens_[current_].offset;
    return static_cast<int32_t>(source_.size());
  }
  absl::Status Error(int32_t offset, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "template syntax error at ", DescribePosition(source_, offset), ": ", what));
  }
  absl::Status Error(absl::string_view what) const { return Error(Offset(), what); }
  absl::Status TooDeep() const {
    return Error(absl::StrCat("template nests deeper than ", kMaxNesting, " levels"));
  }

  bool Is(TokenType t) const { return current_ < tokens_.size() && tokens_[current_].type == t; }
  bool Is2(TokenType t1, TokenType t2) const {
    return current_ + 1 < tokens_.size() && tokens_[current_].type == t1 &&
           tokens_[current_ + 1].type == t2;
  }
  bool IsIdentifier(absl::string_view name, size_t ahead = 0) const {
    const size_t i = current_ + ahead;
    return i < tokens_.size() && tokens_[i].type == TokenType::kIdentifier &&
           tokens_[i].value == name;
  }
  bool IsStatement(std::initializer_list<absl::string_view> names) const {
    if (!Is(TokenType::kOpenStatement) || current_ + 1 >= tokens_.size()) return false;
    const Token& t = tokens_[current_ + 1];
    if (t.type != TokenType::kIdentifier) return false;
    return std::find(names.begin(), names.end(), t.value) != names.end();
  }
  absl::StatusOr<const Token*> Expect(TokenType type, absl::string_view what) {
    if (current_ >= tokens_.size()) {
      return Error(absl::StrCat(what, " (the template ended)"));
    }
    const Token& t = tokens_[current_];
    if (t.type != type) {
      return Error(absl::StrCat(what, ", got ", TokenTypeName(t.type), " '", t.value, "'"));
    }
    ++current_;
    return &t;
  }
  absl::Status ExpectIdentifier(absl::string_view name) {
    if (!IsIdentifier(name)) return Error(absl::StrCat("expected '", name, "'"));
    ++current_;
    return absl::OkStatus();
  }
  absl::Status ExpectClose() {
    return Expect(TokenType::kCloseStatement, "expected '%}'").status();
  }
  // Parses statements until one of `ends` is the next statement.
  absl::Status ParseBodyUntil(std::initializer_list<absl::string_view> ends,
                              std::vector<NodePtr>* body) {
    while (!IsStatement(ends)) {
      if (current_ >= tokens_.size()) {
        std::string names;
        for (absl::string_view e : ends) absl::StrAppend(&names, names.empty() ? "" : " or ", e);
        return Error(absl::StrCat("missing {% ", names, " %}"));
      }
      ASSIGN_OR_RETURN(NodePtr s, ParseAny());
      body->push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<NodePtr> ParseAny() {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    const Token& t = tokens_[current_];
    switch (t.type) {
      case TokenType::kComment: {
        ++current_;
        return NewNode(NodeKind::kComment, t.offset);
      }
      case TokenType::kText: {
        ++current_;
        NodePtr n = NewNode(NodeKind::kText, t.offset);
        n->text = t.value;
        return n;
      }
      case TokenType::kOpenStatement:
        return ParseStatement();
      case TokenType::kOpenExpression: {
        ++current_;
        ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
        RETURN_IF_ERROR(Expect(TokenType::kCloseExpression, "expected '}}'").status());
        return e;
      }
      default:
        return Error(absl::StrCat("unexpected ", TokenTypeName(t.type), " '", t.value, "'"));
    }
  }

  absl::StatusOr<NodePtr> ParseStatement() {
    const int32_t start = Offset();
    ++current_;  // {%
    if (!Is(TokenType::kIdentifier)) return Error("expected a statement name after '{%'");
    const std::string name = tokens_[current_].value;
    ++current_;
    if (name == "set") return ParseSet(start);
    if (name == "if") {
      ASSIGN_OR_RETURN(NodePtr n, ParseIf(start));
      RETURN_IF_ERROR(Expect(TokenType::kOpenStatement, "expected {% endif %}").status());
      RETURN_IF_ERROR(ExpectIdentifier("endif"));
      RETURN_IF_ERROR(ExpectClose());
      return n;
    }
    if (name == "macro") {
      NodePtr n = NewNode(NodeKind::kMacro, start);
      if (!Is(TokenType::kIdentifier)) return Error("expected a macro name");
      n->text = tokens_[current_++].value;
      RETURN_IF_ERROR(ParseArgs(/*parameters=*/true, &n->list));
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endmacro"}, &n->body));
      current_ += 2;
      RETURN_IF_ERROR(ExpectClose());
      return Finish(std::move(n));
    }
    if (name == "for") {
      ASSIGN_OR_RETURN(NodePtr n, ParseFor(start));
      current_ += 2;  // {% endfor
      RETURN_IF_ERROR(ExpectClose());
      return n;
    }
    if (name == "call") {
      NodePtr n = NewNode(NodeKind::kCallBlock, start);
      if (Is(TokenType::kOpenParen)) {
        n->flag = true;
        RETURN_IF_ERROR(ParseArgs(/*parameters=*/true, &n->list));
      }
      if (!Is(TokenType::kIdentifier)) return Error("expected a macro name after 'call'");
      NodePtr callee = NewNode(NodeKind::kIdentifier, Offset());
      callee->text = tokens_[current_++].value;
      NodePtr call = NewNode(NodeKind::kCall, callee->offset);
      call->a = std::move(callee);
      RETURN_IF_ERROR(ParseArgs(/*parameters=*/false, &call->list));
      ASSIGN_OR_RETURN(n->a, Finish(std::move(call)));
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endcall"}, &n->body));
      current_ += 2;
      RETURN_IF_ERROR(ExpectClose());
      return Finish(std::move(n));
    }
    if (name == "filter") {
      NodePtr n = NewNode(NodeKind::kFilterBlock, start);
      if (!Is(TokenType::kIdentifier)) return Error("expected a filter name after 'filter'");
      ASSIGN_OR_RETURN(n->a, ParseFilterNode());
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endfilter"}, &n->body));
      current_ += 2;
      RETURN_IF_ERROR(ExpectClose());
      return Finish(std::move(n));
    }
    if (name == "break" || name == "continue") {
      RETURN_IF_ERROR(ExpectClose());
      return NewNode(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, start);
    }
    return Error(start, absl::StrCat("unsupported statement '{% ", name, " %}'"));
  }

  static bool IsAssignable(const Node& n) {
    if (n.kind == NodeKind::kIdentifier) return true;
    if (n.kind == NodeKind::kMember) {
      return !n.flag && n.b->kind == NodeKind::kIdentifier;
    }
    if (n.kind == NodeKind::kTuple) {
      for (const NodePtr& e : n.list) {
        if (e->kind != NodeKind::kIdentifier) return false;
      }
      return true;
    }
    return false;
  }

  absl::StatusOr<NodePtr> ParseSet(int32_t start) {
    NodePtr n = NewNode(NodeKind::kSet, start);
    ASSIGN_OR_RETURN(n->a, ParseExpressionSequence(false));
    if (!IsAssignable(*n->a)) {
      return Error(n->a->offset, "cannot assign to this expression (a name, a tuple of names or "
                                 "namespace.attribute is needed)");
    }
    if (Is(TokenType::kEquals)) {
      ++current_;
      ASSIGN_OR_RETURN(n->b, ParseExpressionSequence(false));
    } else {
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endset"}, &n->body));
      current_ += 2;
    }
    RETURN_IF_ERROR(ExpectClose());
    return Finish(std::move(n));
  }

  absl::StatusOr<NodePtr> ParseIf(int32_t start) {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    NodePtr n = NewNode(NodeKind::kIf, start);
    ASSIGN_OR_RETURN(n->a, ParseExpression());
    RETURN_IF_ERROR(ExpectClose());
    RETURN_IF_ERROR(ParseBodyUntil({"elif", "else", "endif"}, &n->body));
    if (IsStatement({"elif"})) {
      const int32_t at = Offset();
      current_ += 2;
      ASSIGN_OR_RETURN(NodePtr elif, ParseIf(at));
      n->alternate.push_back(std::move(elif));
    } else if (IsStatement({"else"})) {
      current_ += 2;
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endif"}, &n->alternate));
    }
    return Finish(std::move(n));
  }

  absl::StatusOr<NodePtr> ParseFor(int32_t start) {
    NodePtr n = NewNode(NodeKind::kFor, start);
    ASSIGN_OR_RETURN(n->a, ParseExpressionSequence(true));
    bool ok = n->a->kind == NodeKind::kIdentifier;
    if (n->a->kind == NodeKind::kTuple) {
      ok = true;
      for (const NodePtr& e : n->a->list) ok = ok && e->kind == NodeKind::kIdentifier;
    }
    if (!ok) return Error(n->a->offset, "expected a name or a tuple of names as the loop variable");
    if (!IsIdentifier("in")) return Error("expected 'in' after the loop variable");
    ++current_;
    ASSIGN_OR_RETURN(n->b, ParseExpression());
    RETURN_IF_ERROR(ExpectClose());
    RETURN_IF_ERROR(ParseBodyUntil({"endfor", "else"}, &n->body));
    if (IsStatement({"else"})) {
      current_ += 2;
      RETURN_IF_ERROR(ExpectClose());
      RETURN_IF_ERROR(ParseBodyUntil({"endfor"}, &n->alternate));
    }
    return Finish(std::move(n));
  }

  // A tuple when commas follow (as in `set a, b = ...`), else the expression.
  absl::StatusOr<NodePtr> ParseExpressionSequence(bool primary) {
    const int32_t start = Offset();
    std::vector<NodePtr> items;
    {
      ASSIGN_OR_RETURN(NodePtr e, primary ? ParsePrimary() : ParseExpression());
      items.push_back(std::move(e));
    }
    const bool is_tuple = Is(TokenType::kComma);
    while (is_tuple) {
      ++current_;
      ASSIGN_OR_RETURN(NodePtr e, primary ? ParsePrimary() : ParseExpression());
      items.push_back(std::move(e));
      if (!Is(TokenType::kComma)) break;
    }
    if (!is_tuple) return std::move(items[0]);
    NodePtr t = NewNode(NodeKind::kTuple, start);
    t->list = std::move(items);
    return Finish(std::move(t));
  }

  absl::StatusOr<NodePtr> ParseExpression() {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    // Ternary / select: a if b [else c]
    ASSIGN_OR_RETURN(NodePtr a, ParseOr());
    if (!IsIdentifier("if")) return a;
    const int32_t at = a->offset;
    ++current_;
    ASSIGN_OR_RETURN(NodePtr test, ParseOr());
    if (IsIdentifier("else")) {
      ++current_;
      ASSIGN_OR_RETURN(NodePtr otherwise, ParseExpression());
      NodePtr n = NewNode(NodeKind::kTernary, at);
      n->a = std::move(test);
      n->b = std::move(a);
      n->c = std::move(otherwise);
      return Finish(std::move(n));
    }
    NodePtr n = NewNode(NodeKind::kSelect, at);
    n->a = std::move(a);
    n->b = std::move(test);
    return Finish(std::move(n));
  }

  absl::StatusOr<NodePtr> Binary(std::string op, NodePtr left, NodePtr right) {
    NodePtr n = NewNode(NodeKind::kBinary, left->offset);
    n->text = std::move(op);
    n->a = std::move(left);
    n->b = std::move(right);
    return Finish(std::move(n));
  }

  absl::StatusOr<NodePtr> ParseOr() {
    ASSIGN_OR_RETURN(NodePtr left, ParseAnd());
    while (IsIdentifier("or")) {
      ++current_;
      ASSIGN_OR_RETURN(NodePtr right, ParseAnd());
      ASSIGN_OR_RETURN(left, Binary("or", std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseAnd() {
    ASSIGN_OR_RETURN(NodePtr left, ParseNot());
    while (IsIdentifier("and")) {
      ++current_;
      ASSIGN_OR_RETURN(NodePtr right, ParseNot());
      ASSIGN_OR_RETURN(left, Binary("and", std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseNot() {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    if (IsIdentifier("not")) {
      const int32_t at = Offset();
      ++current_;
      ASSIGN_OR_RETURN(NodePtr arg, ParseNot());
      NodePtr n = NewNode(NodeKind::kUnary, at);
      n->text = "not";
      n->a = std::move(arg);
      return Finish(std::move(n));
    }
    return ParseComparison();
  }

  absl::StatusOr<NodePtr> ParseComparison() {
    ASSIGN_OR_RETURN(NodePtr left, ParseAdditive());
    while (true) {
      std::string op;
      if (IsIdentifier("not") && IsIdentifier("in", 1)) {
        op = "not in";
        current_ += 2;
      } else if (IsIdentifier("in")) {
        op = "in";
        ++current_;
      } else if (Is(TokenType::kComparisonBinaryOperator)) {
        op = tokens_[current_++].value;
      } else {
        break;
      }
      ASSIGN_OR_RETURN(NodePtr right, ParseAdditive());
      ASSIGN_OR_RETURN(left, Binary(std::move(op), std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseAdditive() {
    ASSIGN_OR_RETURN(NodePtr left, ParseMultiplicative());
    while (Is(TokenType::kAdditiveBinaryOperator)) {
      std::string op = tokens_[current_++].value;
      ASSIGN_OR_RETURN(NodePtr right, ParseMultiplicative());
      ASSIGN_OR_RETURN(left, Binary(std::move(op), std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseMultiplicative() {
    ASSIGN_OR_RETURN(NodePtr left, ParsePower());
    while (Is(TokenType::kMultiplicativeBinaryOperator)) {
      std::string op = tokens_[current_++].value;
      ASSIGN_OR_RETURN(NodePtr right, ParsePower());
      ASSIGN_OR_RETURN(left, Binary(std::move(op), std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParsePower() {
    ASSIGN_OR_RETURN(NodePtr left, ParseTest());
    while (Is(TokenType::kExponentiationBinaryOperator)) {
      ++current_;
      ASSIGN_OR_RETURN(NodePtr right, ParseTest());
      ASSIGN_OR_RETURN(left, Binary("**", std::move(left), std::move(right)));
    }
    return left;
  }

  absl::StatusOr<NodePtr> ParseTest() {
    ASSIGN_OR_RETURN(NodePtr operand, ParseFilter());
    while (IsIdentifier("is")) {
      ++current_;
      const bool negate = IsIdentifier("not");
      if (negate) ++current_;
      if (!Is(TokenType::kIdentifier)) return Error("expected a test name after 'is'");
      const Token& name = tokens_[current_++];
      if (!IsKnownTest(name.value)) {
        return Error(name.offset, absl::StrCat("unknown test '", name.value, "'"));
      }
      if (Is(TokenType::kOpenParen) || Is(TokenType::kNumericLiteral) ||
          Is(TokenType::kStringLiteral)) {
        return Error(absl::StrCat("test '", name.value, "' with an argument is not supported"));
      }
      NodePtr n = NewNode(NodeKind::kTest, operand->offset);
      n->text = name.value;
      n->flag = negate;
      n->a = std::move(operand);
      ASSIGN_OR_RETURN(operand, Finish(std::move(n)));
    }
    return operand;
  }

  // A filter: a name, or a name called with arguments.
  absl::StatusOr<NodePtr> ParseFilterNode() {
    const Token& name = tokens_[current_];
    if (name.type != TokenType::kIdentifier) return Error("expected a filter name");
    if (!IsKnownFilter(name.value)) {
      return Error(name.offset, absl::StrCat("unknown filter '", name.value, "'"));
    }
    ++current_;
    NodePtr id = NewNode(NodeKind::kIdentifier, name.offset);
    id->text = name.value;
    if (!Is(TokenType::kOpenParen)) return id;
    NodePtr call = NewNode(NodeKind::kCall, name.offset);
    call->a = std::move(id);
    RETURN_IF_ERROR(ParseArgs(/*parameters=*/false, &call->list));
    if (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket) || Is(TokenType::kOpenParen)) {
      return Error("a filter call cannot be followed by '.', '[' or '('");
    }
    return Finish(std::move(call));
  }

  absl::StatusOr<NodePtr> ParseFilter() {
    ASSIGN_OR_RETURN(NodePtr operand, ParseUnarySign());
    while (Is(TokenType::kPipe)) {
      ++current_;
      if (current_ >= tokens_.size()) return Error("expected a filter name after '|'");
      ASSIGN_OR_RETURN(NodePtr filter, ParseFilterNode());
      NodePtr n = NewNode(NodeKind::kFilter, operand->offset);
      n->a = std::move(operand);
      n->b = std::move(filter);
      ASSIGN_OR_RETURN(operand, Finish(std::move(n)));
    }
    return operand;
  }

  absl::StatusOr<NodePtr> ParseUnarySign() {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    if (current_ < tokens_.size()) {
      const Token& t = tokens_[current_];
      if ((t.type == TokenType::kUnaryOperator || t.type == TokenType::kAdditiveBinaryOperator) &&
          (t.value == "-" || t.value == "+")) {
        ++current_;
        ASSIGN_OR_RETURN(NodePtr arg, ParseUnarySign());
        NodePtr n = NewNode(NodeKind::kUnary, t.offset);
        n->text = t.value;
        n->a = std::move(arg);
        return Finish(std::move(n));
      }
    }
    return ParseCallMember();
  }

  absl::StatusOr<NodePtr> ParseCallMember() {
    ASSIGN_OR_RETURN(NodePtr primary, ParsePrimary());
    ASSIGN_OR_RETURN(NodePtr member, ParseMember(std::move(primary)));
    if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
    return member;
  }

  absl::StatusOr<NodePtr> ParseCall(NodePtr callee) {
    // foo(...), then any .x / [y] / (...) that follow.
    while (true) {
      NodePtr call = NewNode(NodeKind::kCall, callee->offset);
      call->a = std::move(callee);
      RETURN_IF_ERROR(ParseArgs(/*parameters=*/false, &call->list));
      ASSIGN_OR_RETURN(NodePtr done, Finish(std::move(call)));
      ASSIGN_OR_RETURN(callee, ParseMember(std::move(done)));
      if (!Is(TokenType::kOpenParen)) return callee;
    }
  }

  absl::Status ParseArgs(bool parameters, std::vector<NodePtr>* args) {
    RETURN_IF_ERROR(Expect(TokenType::kOpenParen, "expected '('").status());
    absl::flat_hash_set<std::string> names;
    bool saw_keyword = false;
    bool saw_spread = false;
    while (!Is(TokenType::kCloseParen)) {
      if (current_ >= tokens_.size()) return Error("expected ')'");
      const int32_t at = Offset();
      const bool keyword_spread = Is(TokenType::kExponentiationBinaryOperator);
      const bool positional_spread =
          Is(TokenType::kMultiplicativeBinaryOperator) && tokens_[current_].value == "*";
      if (parameters && (keyword_spread || positional_spread)) {
        return Error("argument unpacking is not allowed in parameter declarations");
      }
      if (keyword_spread) {
        ++current_;
        NodePtr n = NewNode(NodeKind::kKeywordSpread, at);
        ASSIGN_OR_RETURN(n->a, ParseExpression());
        ASSIGN_OR_RETURN(NodePtr done, Finish(std::move(n)));
        args->push_back(std::move(done));
        if (Is(TokenType::kComma)) ++current_;
        if (!Is(TokenType::kCloseParen)) return Error("'**' must be applied to the final argument");
        break;
      }
      NodePtr arg;
      if (positional_spread) {
        if (saw_spread) return Error("only one '*' argument unpacking is allowed");
        saw_spread = true;
        ++current_;
        NodePtr n = NewNode(NodeKind::kSpread, at);
        ASSIGN_OR_RETURN(n->a, ParseExpression());
        ASSIGN_OR_RETURN(arg, Finish(std::move(n)));
      } else {
        ASSIGN_OR_RETURN(arg, ParseExpression());
        if (Is(TokenType::kEquals)) {
          ++current_;
          if (arg->kind != NodeKind::kIdentifier) {
            return Error(arg->offset, parameters ? "expected a name for the parameter"
                                                 : "expected a name for the keyword argument");
          }
          NodePtr kw = NewNode(NodeKind::kKeywordArg, arg->offset);
          kw->text = arg->text;
          ASSIGN_OR_RETURN(kw->a, ParseExpression());
          ASSIGN_OR_RETURN(arg, Finish(std::move(kw)));
        }
        if (parameters) {
          if (arg->kind != NodeKind::kIdentifier && arg->kind != NodeKind::kKeywordArg) {
            return Error(arg->offset, "expected a name for the parameter");
          }
          if (!names.insert(arg->text).second) {
            return Error(arg->offset, absl::StrCat("duplicate parameter name: ", arg->text));
          }
        }
        if (arg->kind == NodeKind::kKeywordArg) {
          saw_keyword = true;
        } else if (saw_keyword) {
          return Error(arg->offset, parameters ? "non-default parameter follows default parameter"
                                               : "positional argument follows keyword argument");
        } else if (saw_spread) {
          return Error(arg->offset, "positional argument follows '*' unpacking");
        }
      }
      args->push_back(std::move(arg));
      if (Is(TokenType::kComma)) ++current_;
    }
    ++current_;  // )
    return absl::OkStatus();
  }

  // [index] or [start:stop:step]
  absl::StatusOr<NodePtr> ParseSubscript() {
    const int32_t at = Offset();
    std::vector<NodePtr> parts;
    bool is_slice = false;
    while (!Is(TokenType::kCloseSquareBracket)) {
      if (current_ >= tokens_.size()) return Error("expected ']'");
      if (Is(TokenType::kColon)) {
        parts.push_back(nullptr);
        ++current_;
        is_slice = true;
      } else {
        ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
        parts.push_back(std::move(e));
        if (Is(TokenType::kColon)) {
          ++current_;
          is_slice = true;
        }
      }
    }
    if (parts.empty()) return Error("expected an index or a slice inside '[]'");
    if (!is_slice) return std::move(parts[0]);
    if (parts.size() > 3) return Error("a slice takes at most three parts");
    NodePtr n = NewNode(NodeKind::kSlice, at);
    n->a = std::move(parts[0]);
    if (parts.size() > 1) n->b = std::move(parts[1]);
    if (parts.size() > 2) n->c = std::move(parts[2]);
    return Finish(std::move(n));
  }

  absl::StatusOr<NodePtr> ParseMember(NodePtr object) {
    while (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket)) {
      const bool computed = Is(TokenType::kOpenSquareBracket);
      ++current_;
      NodePtr n = NewNode(NodeKind::kMember, object->offset);
      n->flag = computed;
      if (computed) {
        ASSIGN_OR_RETURN(n->b, ParseSubscript());
        RETURN_IF_ERROR(Expect(TokenType::kCloseSquareBracket, "expected ']'").status());
      } else {
        ASSIGN_OR_RETURN(n->b, ParsePrimary());
        if (n->b->kind != NodeKind::kIdentifier && n->b->kind != NodeKind::kInteger) {
          return Error(n->b->offset, "expected a name or an integer after '.'");
        }
      }
      n->a = std::move(object);
      ASSIGN_OR_RETURN(object, Finish(std::move(n)));
    }
    return object;
  }

  absl::StatusOr<NodePtr> ParsePrimary() {
    Guard g(this);
    if (g.too_deep()) return TooDeep();
    if (current_ >= tokens_.size()) return Error("unexpected end of template");
    const Token& t = tokens_[current_++];
    switch (t.type) {
      case TokenType::kNumericLiteral: {
        const bool is_float = t.value.find('.') != std::string::npos;
        NodePtr n = NewNode(is_float ? NodeKind::kFloat : NodeKind::kInteger, t.offset);
        n->number = std::strtod(t.value.c_str(), nullptr);
        return n;
      }
      case TokenType::kStringLiteral: {
        NodePtr n = NewNode(NodeKind::kString, t.offset);
        n->text = t.value;
        while (Is(TokenType::kStringLiteral)) n->text += tokens_[current_++].value;
        return n;
      }
      case TokenType::kIdentifier: {
        NodePtr n = NewNode(NodeKind::kIdentifier, t.offset);
        n->text = t.value;
        return n;
      }
      case TokenType::kOpenParen: {
        ASSIGN_OR_RETURN(NodePtr e, ParseExpressionSequence(false));
        RETURN_IF_ERROR(Expect(TokenType::kCloseParen, "expected ')'").status());
        return e;
      }
      case TokenType::kOpenSquareBracket: {
        NodePtr n = NewNode(NodeKind::kArray, t.offset);
        while (!Is(TokenType::kCloseSquareBracket)) {
          if (current_ >= tokens_.size()) return Error("expected ']'");
          ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
          n->list.push_back(std::move(e));
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return Finish(std::move(n));
      }
      case TokenType::kOpenCurlyBracket: {
        NodePtr n = NewNode(NodeKind::kObject, t.offset);
        while (!Is(TokenType::kCloseCurlyBracket)) {
          if (current_ >= tokens_.size()) return Error("expected '}'");
          ASSIGN_OR_RETURN(NodePtr k, ParseExpression());
          RETURN_IF_ERROR(Expect(TokenType::kColon, "expected ':' in a dict literal").status());
          ASSIGN_OR_RETURN(NodePtr v, ParseExpression());
          n->list.push_back(std::move(k));
          n->list.push_back(std::move(v));
          if (Is(TokenType::kComma)) ++current_;
        }
        ++current_;
        return Finish(std::move(n));
      }
      default:
        return Error(t.offset, absl::StrCat("unexpected ", TokenTypeName(t.type), " '", t.value, "'"));
    }
  }

  const std::vector<Token>& tokens_;
  absl::string_view source_;
  size_t current_ = 0;
  int nesting_ = 0;
};

}  // namespace

bool IsKnownFilter(absl::string_view name) {
  for (const char* f : kFilters) {
    if (name == f) return true;
  }
  return false;
}

bool IsKnownTest(absl::string_view name) {
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

absl::StatusOr<NodePtr> Parse(const std::vector<Token>& tokens, absl::string_view source) {
  Parser parser(tokens, source);
  return parser.Run();
}

}  // namespace tessera::text::jinja
