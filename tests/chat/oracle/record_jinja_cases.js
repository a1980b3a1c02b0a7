#!/usr/bin/env node
// Records @huggingface/jinja's rendering of the interpreter's unit-test
// templates into text/jinja/testdata/render_cases.json, which
// text/jinja/template_test.cc replays hermetically (no node at test time).
// Re-run after changing the case list:
//   bash tests/chat/run_oracle.sh build/chat_oracle build/chat_oracle/expected.json
//   node tests/chat/oracle/record_jinja_cases.js --modules build/chat_oracle/node_modules \
//     --out text/jinja/testdata/render_cases.json
// Each case: [name, template, variables]; the recorded file adds the
// oracle's output, or its error message when the template raised.
"use strict";

const fs = require("fs");
const { arg: argOf, requireFrom } = require("../../oracle/cli.js");

const arg = (name) => argOf("record_jinja_cases.js", name);

const req = requireFrom(arg("modules"));
const { Template } = req("@huggingface/jinja");

const CASES = [
 ["text_only", "hello world", {}],
 ["trailing_newline_dropped", "hello\n", {}],
 ["comment", "a{# note #}b", {}],
 ["comment_strip", "a  {#- note -#}  b", {}],
 ["expr_int", "{{ 1 + 2 * 3 }}", {}],
 ["expr_precedence_power", "{{ 2 ** 3 ** 2 }}", {}],
 ["expr_float_print", "{{ 1.0 }} {{ 2.5 }} {{ 1 / 2 }} {{ 4 / 2 }} {{ -0.0 }}", {}],
 ["expr_floor_mod", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 // 2 }}", {}],
 ["expr_big_numbers", "{{ 100000000000000000000 * 10 }} {{ 0.1 + 0.2 }} {{ 123456789012 }} {{ 0.000001 / 10 }} {{ 2 ** 70 }}", {}],
 ["expr_unary", "{{ -x }} {{ +x }} {{ - 3 }} {{ not x }} {{ -(1.5) }}", {"x": 4}],
 ["expr_concat_tilde", "{{ 'a' ~ 1 ~ true ~ 2.5 ~ 1.0 }}", {}],
 ["expr_concat_plus", "{{ 'n=' + 3 + ', f=' + 2.0 }}", {}],
 ["expr_compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 1 == 1.0 }} {{ 'a' == 'a' }} {{ 'a' != 'b' }}", {}],
 ["expr_loose_equality", "{{ 1 == true }} {{ '1' == 1 }} {{ '' == 0 }} {{ none == x }} {{ [1] == [1] }} {{ xs == xs }}", {"xs": [1]}],
 ["expr_and_or_values", "{{ 0 or 'b' }} {{ 'a' and 'b' }} {{ '' and 'x' }} {{ [] or [1] }}", {}],
 ["expr_in", "{{ 'b' in 'abc' }} {{ 2 in [1,2] }} {{ 'k' in d }} {{ 'z' not in d }} {{ 1 in undefined_thing }}", {"d": {"k": 1}}],
 ["expr_ternary", "{{ 'yes' if x else 'no' }} {{ 'a' if false else 'b' if true else 'c' }}", {"x": 1}],
 ["expr_select_undefined", "[{{ 'shown' if false }}]", {}],
 ["expr_list_dict_tuple", "{{ [1, 'two', [3]] }} {{ {'a': 1, 'b': [true, none]} }}", {}],
 ["expr_string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"uote\" }}|{{ 'uni\\u00e9' }}|{{ 'x\\x41' }}", {}],
 ["expr_adjacent_strings", "{{ 'a' 'b' \"c\" }}", {}],
 ["member_access", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ xs[0] }} {{ xs[-1] }} {{ xs.1 }}", {"m": {"role": "user", "content": "hi"}, "xs": [10, 20, 30]}],
 ["member_of_undefined", "[{{ nothing.attr }}][{{ m.missing.deeper }}]", {"m": {}}],
 ["slices", "{{ xs[1:] }} {{ xs[:2] }} {{ xs[::-1] }} {{ xs[::2] }} {{ xs[-2:] }} {{ s[1:3] }} {{ s[::-1] }}", {"xs": [1, 2, 3, 4], "s": "héllo"}],
 ["string_index", "{{ s[0] }}{{ s[-1] }}", {"s": "abc"}],
 ["whitespace_dash", "a  {{- 'b' -}}  c\n  {%- if true -%}  d  {%- endif -%}  e", {}],
 ["trim_lstrip_blocks", "<ul>\n  {% for x in xs %}\n  <li>{{ x }}</li>\n  {% endfor %}\n</ul>", {"xs": [1, 2]}],
 ["expression_newline_kept", "{{ 'a' }}\n{{ 'b' }}\n", {}],
 ["if_elif_else", "{% for x in xs %}{% if x < 2 %}small{% elif x < 4 %}mid{% else %}big{% endif %};{% endfor %}", {"xs": [1, 3, 5]}],
 ["for_loop_vars", "{% for x in xs %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }}/{{ loop.previtem }}/{{ loop.nextitem }};{% endfor %}", {"xs": ["a", "b", "c"]}],
 ["for_if_filter", "{% for x in xs if x % 2 == 1 %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {"xs": [1, 2, 3, 4, 5]}],
 ["for_else", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", {"xs": []}],
 ["for_dict_keys_items", "{% for k in d %}{{ k }}{% endfor %} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"a": 1, "b": 2}}],
 ["for_nested_loop", "{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}],
 ["for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}],
 ["for_scope_does_not_leak", "{% set y = 'outer' %}{% for x in [1] %}{% set y = 'inner' %}{{ y }}{% endfor %} {{ y }}", {}],
 ["if_scope_leaks", "{% if true %}{% set y = 'set in if' %}{% endif %}{{ y }}", {}],
 ["set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}", {}],
 ["set_block", "{% set body %}Hello {{ name }}!{% endset %}[{{ body }}]", {"name": "Ana"}],
 ["namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in xs %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}", {"xs": [1, 2, 3]}],
 ["namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}{{ ns | tojson }}", {}],
 ["macro_basic", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bo') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}", {}],
 ["macro_varargs_kwargs", "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}],
 ["macro_sees_caller_scope", "{% macro show() %}{{ who }}{% endmacro %}{% for who in ['a', 'b'] %}{{ show() }}{% endfor %}", {}],
 ["macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(4) }}", {}],
 ["call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", {}],
 ["call_block_args", "{% macro each(xs) %}{% for x in xs %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(item) each([1, 2]) %}[{{ item }}]{% endcall %}", {}],
 ["filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}", {}],
 ["filters_string", "{{ '  pad  ' | trim }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ 'abc' | length }}", {}],
 ["filters_list", "{{ xs | first }} {{ xs | last }} {{ xs | length }} {{ xs | reverse }} {{ xs | sort }} {{ xs | unique }} {{ xs | join }} {{ xs | join(', ') }} {{ xs | list }}", {"xs": [3, 1, 2, 3]}],
 ["filter_join_strings", "{{ ['a', 'b'] | join('-') }} {{ 'abc' | join('.') }}", {}],
 ["filters_numbers", "{{ -3 | abs }} {{ 3.7 | int }} {{ '42' | int }} {{ '4.5x' | float }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3 | float }} {{ 2 | string }} {{ 2.0 | string }} {{ true | int }}", {}],
 ["filter_default", "{{ missing | default('dflt') }} {{ '' | default('empty', true) }} {{ '' | default('kept') }} {{ x | default('no') }}", {"x": 0}],
 ["filter_items_dictsort", "{{ d | items }} {{ d | dictsort }} {{ d | length }}", {"d": {"b": 2, "a": 1}}],
 ["filter_selectattr_map", "{{ xs | selectattr('on') | map(attribute='n') | join(',') }} {{ xs | rejectattr('on') | map(attribute='n') | join(',') }} {{ xs | selectattr('n', 'equalto', 'b') | map(attribute='n') | list }}", {"xs": [{"n": "a", "on": true}, {"n": "b", "on": false}, {"n": "c", "on": true}]}],
 ["filter_map_default", "{{ xs | map(attribute='k', default='?') | join }}", {"xs": [{"k": "x"}, {}]}],
 ["filter_sort_attribute", "{{ xs | sort(attribute='n') | map(attribute='n') | join }} {{ xs | sort(reverse=true, attribute='n') | map(attribute='n') | join }}", {"xs": [{"n": "b"}, {"n": "A"}, {"n": "c"}]}],
 ["filter_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}", {}],
 ["filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }}", {}],
 ["filter_tojson", "{{ v | tojson }}", {"v": {"s": "é\"\\\n\u0001", "n": [1, 2.5, -0.5, 1e-7, 1e21, null, true], "e": {}, "l": []}}],
 ["filter_tojson_indent", "{{ v | tojson(indent=2) }}", {"v": {"a": [1, {"b": null}], "c": "x", "e": [], "o": {}}}],
 ["filter_tojson_ascii_separators", "{{ v | tojson(ensure_ascii=true) }} {{ v | tojson(separators=(',', ':')) }}", {"v": {"k": "中文😀\u007f", "l": [1, 2]}}],
 ["filter_string_of_list", "{{ xs | string }}", {"xs": [1, "a", {"b": null}]}],
 ["filter_safe", "{{ '<b>' | safe }}", {}],
 ["tests_types", "{{ x is defined }} {{ y is undefined }} {{ n is none }} {{ s is string }} {{ i is number }} {{ i is integer }} {{ f is integer }} {{ b is boolean }} {{ d is mapping }} {{ l is iterable }} {{ s is iterable }} {{ d is iterable }} {{ l is sequence }} {{ d is sequence }}", {"x": 1, "n": null, "s": "s", "i": 3, "f": 1.5, "b": true, "d": {"a": 1}, "l": [1]}],
 ["tests_values", "{{ 3 is odd }} {{ 4 is even }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ x is not none }} {{ f is callable }}", {"x": 1}],
 ["string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.upper() }}|{{ s.lower() }}|{{ 'a b'.title() }}|{{ 'x'.capitalize() }}", {"s": "  Mixed Case \n"}],
 ["string_strip_with_args_is_whitespace", "[{{ s.strip('\\n') }}][{{ s.lstrip('\\n') }}][{{ s.rstrip('\\n') }}]", {"s": "\n  text  \n"}],
 ["string_startswith_endswith", "{{ s.startswith('ab') }} {{ s.endswith('yz') }} {{ s.startswith(('x', 'a')) }} {{ s.endswith(['q']) }}", {"s": "abxyz"}],
 ["string_split", "{{ s.split() }} {{ s.split(' ') }} {{ s.split('b') }} {{ s.split(none, 1) }} {{ 'a,b,c'.split(',', 1) }} {{ 'a</think>b'.split('</think>')[-1] }}", {"s": "  a b  c "}],
 ["string_replace_method", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '+', 1) }}", {}],
 ["dict_methods", "{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() }} {{ d.values() }} {{ d.items() }}", {"d": {"a": 1, "b": [2]}}],
 ["dict_key_shadows_method", "{{ d.items }}", {"d": {"items": "data"}}],
 ["length_property", "{{ xs.length }} {{ s.length }}", {"xs": [1, 2], "s": "héllo"}],
 ["range_function", "{{ range(3) }} {{ range(1, 4) }} {{ range(5, 0, -2) }}", {}],
 ["raise_exception", "{% if bad %}{{ raise_exception('Bad input: ' ~ bad) }}{% endif %}ok", {"bad": "x"}],
 ["true_false_titlecase", "{{ True }} {{ False }} {{ None }}|{{ true }}", {}],
 ["print_none_undefined_bool", "[{{ none }}][{{ undefined_var }}][{{ true }}][{{ 0 }}]", {}],
 ["objects_print_as_json", "{{ d }} {{ l }}", {"d": {"a": "b", "n": null}, "l": ["x", 1.5]}],
 ["unicode_text", "{{ s | trim }}|{{ s | length }}|{{ s[::-1] }}", {"s": "\u3000 你好😀e\u0301 \u00a0"}],
 ["generation_tag_removed", "A {% generation %}B{% endgeneration %} C", {}],
 ["spread_arguments", "{% macro f(a, b, c) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ f(*[1, 2, 3]) }} {{ f(**{'a': 'x', 'b': 'y', 'c': 'z'}) }}", {}],
 ["tpl_reassign_messages", "{%- if messages[0]['role'] == 'system' %}{%- set sys = messages[0]['content'] | trim %}{%- set messages = messages[1:] %}{%- else %}{%- set sys = '' %}{%- endif %}[{{ sys }}]{% for m in messages %}{{ m.role }};{% endfor %}", {"messages": [{"role": "system", "content": " S "}, {"role": "user", "content": "u"}]}],
 ["tpl_date_default", "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}Today Date: {{ date_string }}", {}],
 ["tpl_date_given", "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}Today Date: {{ date_string }}", {"date_string": "01 Jan 2025"}],
 ["tpl_tools_indent4", "{%- for t in tools %}{{- t | tojson(indent=4) }}\n\n{% endfor %}", {"tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]}],
 ["tpl_tool_schema_key_order", "{{ tools | tojson }}|{% for k, v in tools[0].function.parameters.properties.items() %}{{ k }},{% endfor %}|{{ messages[0].tool_calls[0].function.arguments | tojson }}", {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"zeta": {"type": "string", "description": "z"}, "alpha": {"type": "number"}}, "required": ["zeta", "alpha"]}, "description": "weather"}}], "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"zeta": "Oslo", "alpha": 2}}}]}]}],
 ["tpl_single_tool_call", "{%- set tc = messages[0].tool_calls[0].function %}{%- if messages[0].tool_calls | length != 1 %}{{ raise_exception('one call only') }}{% endif %}{{- '{\"name\": \"' + tc.name + '\", ' }}{{- '\"parameters\": ' }}{{- tc.arguments | tojson }}}", {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "get", "arguments": {"city": "Zürich", "n": 2}}}]}]}],
 ["tpl_think_split", "{{ c.split('</think>')[-1] | trim }}|{{ c.split('</think>')[0].split('<think>')[-1] | trim }}", {"c": "<think>\nplan\n</think>\n\nanswer "}],
 ["tpl_tilde_filter_precedence", "{{ '<tool_call>' ~ call | tojson ~ '</tool_call>' }}", {"call": {"name": "f", "arguments": {}}}],
 ["tpl_selectattr_count", "{{ messages | selectattr('role', 'equalto', 'system') | list | length }}", {"messages": [{"role": "system"}, {"role": "user"}, {"role": "system"}]}],
 ["tpl_map_chain", "{{ tools | map(attribute='function') | map(attribute='name') | join(', ') }}|{{ tools | map(attribute='function.name') | join(',') }}", {"tools": [{"function": {"name": "a"}}, {"function": {"name": "b"}}]}],
 ["tpl_properties_items", "{% for k, v in tool.parameters.properties.items() %}{{ k }}:{{ v.type | upper }}{% if v.enum is defined %}[{{ v.enum | join('|') }}]{% endif %};{% endfor %}", {"tool": {"parameters": {"properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer"}}}}}],
 ["tpl_or_default_content", "[{{ (m.content or '') | trim }}]", {"m": {"content": null}}],
 ["tpl_last_index", "{% for m in messages %}{{ loop.index0 == messages | length - 1 }} {% endfor %}", {"messages": [1, 2, 3]}],
 ["tpl_content_checks", "{% for m in messages %}{% if m.content is not none and m.content | length > 0 %}[{{ m.content }}]{% elif m.content is mapping %}map{% else %}none{% endif %}{% endfor %}", {"messages": [{"content": "a"}, {"content": ""}, {"content": null}, {"content": {"k": 1}}]}],
 ["tpl_ensure_ascii_false_titlecase", "{{ d | tojson(ensure_ascii=False) }} {{ d | tojson(ensure_ascii=True) }}", {"d": {"k": "é😀"}}],
 ["tpl_tojson_indent_separators", "{{ d | tojson(indent=2, separators=(',', ': ')) }}", {"d": {"a": [1, 2], "b": {}}}],
 ["tpl_macro_default_uses_param", "{% macro f(a, b=a ~ '!') %}{{ a }}{{ b }}{% endmacro %}{{ f('x') }} {{ f('x', 'y') }}", {}],
 ["tpl_undefined_dunder", "[{{ x.__class__ }}][{{ 'abc'.__len__ }}]", {"x": {}}],
 ["tpl_messages_negative_index", "{{ messages[-1].role }} {{ messages[-1]['content'] }}", {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}],
 ["tpl_loop_in_macro_sets", "{% set ns = namespace(idx=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}", {"messages": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}, {"role": "assistant"}]}],
 ["tpl_content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p.type == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}", {"messages": [{"content": "s"}, {"content": [{"type": "text", "text": "t"}, {"type": "image"}]}]}],
 ["tpl_string_format_percent", "{{ '%s' % 'x' }}", {}],
 ["tpl_int_filter_arith", "{{ n | int + 1 }} {{ '3' | int * 2 }}", {"n": "41"}],
 ["tpl_is_precedence", "{{ 1 + 2 is odd }} {{ not x is defined }} {{ x is defined and x }}", {"x": 0}],
 ["tpl_nested_ternary_filter", "{{ (a if a is string else a | tojson) }} {{ b if b is string else b | tojson }}", {"a": "s", "b": [1]}],
 ["tpl_unicode_escapes_in_template", "{{ '\\u4f60\\u597d' }} {{ '\\xe9' }} {{ '\\ud83d\\ude00' }}", {}],
 ["tpl_lstrip_comment_and_crlf", "a\r\n  {# c #}\r\n  {% if true %}\r\nb\r\n  {% endif %}\r\n", {}],
 ["tpl_dash_on_comment_and_text", "x  {#- a -#}  y {%- if true %} z {% endif -%} w", {}],
 ["tpl_raise_in_macro", "{% macro check(m) %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endmacro %}{% for m in messages %}{{ check(m) }}{% endfor %}ok", {"messages": [{"role": "user"}, {"role": "tool"}]}],
 ["tpl_dict_literal_iteration", "{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}{{ v }}{% endfor %}", {}],
 ["tpl_list_concat", "{{ ([1] + [2, 3]) | length }} {{ [1] + [2] }}", {}],
 ["tpl_first_of_empty", "[{% set f = [] | first %}{{ f }}]", {}],
 ["tpl_loop_cycle_missing", "{% for x in [1] %}[{{ loop.depth }}]{% endfor %}", {}],
 ["tpl_string_iteration_error", "{% for c in 'abc' %}{{ c }}{% endfor %}", {}],
 ["tpl_namespace_attr_missing", "[{{ namespace(a=1).b }}]", {}],
 ["tpl_get_with_default_none", "{{ d.get('x', none) is none }}", {"d": {}}],
 ["error_undefined_call", "{{ nothing() }}", {}],
 ["error_for_over_undefined", "{% for x in nothing %}{{ x }}{% endfor %}", {}],
 ["error_add_undefined", "{{ 1 + nothing }}", {}],
 ["error_concat_none", "{{ 'a' + none }}", {}],
 ["error_unknown_filter_on_type", "{{ 3 | trim }}", {}],
 ["error_break_outside_loop", "{% break %}", {}],
 ["error_macro_too_many_args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}", {}],
 ["error_set_attr_on_dict", "{% set d.x = 1 %}", {"d": {}}],
 ["error_unterminated_string", "{{ 'abc }}", {}],
 ["error_unknown_statement", "{% include 'x.html' %}", {}],
 ["error_missing_endif", "{% if true %}x", {}],
 ["error_tuple_tojson", "{{ (1, 2) | tojson }}", {}],
 ["error_compare_strings", "{{ 'a' < 'b' }}", {}],
];

const out = [];
// Variables keep their key order: the C++ side reads them as
// nlohmann::ordered_json, as transformers keeps Python's dict order.
for (const [name, template, vars] of CASES) {
  const r = { name, template, vars };
  try {
    r.output = new Template(template).render(vars);
  } catch (e) {
    r.error = String(e && e.message ? e.message : e);
  }
  out.push(r);
}
fs.writeFileSync(arg("out"), JSON.stringify(out, null, 1) + "\n");
console.log(`recorded ${out.length} cases`);
