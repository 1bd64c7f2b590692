// Jinja language features, each a small template rendered by kvlm and by jinja2 (the oracle).
#include <gtest/gtest.h>

#include "chat/chat_template.h"
#include "chat/jinja_oracle_client.h"

namespace kvlm::chat {
namespace {

using testing::OracleCase;

struct FeatureCase {
  const char* name;
  std::string source;
  nlohmann::json context = nlohmann::json::object();
};

std::vector<FeatureCase> feature_cases() {
  const nlohmann::json msgs = nlohmann::json::parse(
      R"([{"role":"system","content":"sys"},{"role":"user","content":"hi there"},{"role":"assistant","content":" ok "}])");
  return {
      // Whitespace control, trim_blocks, lstrip_blocks.
      {"trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter"},
      {"lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc"},
      {"lstrip_not_variables", "a\n    {{ 'x' }}\n  b"},
      {"lstrip_text_before", "a  {% if true %}b{% endif %}  c"},
      {"minus_both", "a   {%- if true -%}   b   {%- endif -%}   c"},
      {"minus_print", "a \n {{- 'x' -}} \n b"},
      {"plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}"},
      {"plus_disables_trim", "{% if true +%}\nb{% endif %}"},
      {"comment", "a\n  {# note #}\nb {#- x -#} c"},
      {"comment_trim", "{# c #}\n{{ 'x' }}"},
      {"raw_block", "{% raw %}{{ not evaluated }}{% endraw %}!"},
      {"crlf_newlines", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n"},
      {"trailing_newline_dropped", "x\n"},
      {"two_trailing_newlines", "x\n\n"},
      {"unicode_space_minus", "a\u3000\u00a0{%- if true %}b{% endif %}"},
      // Printing Python values.
      {"print_values", "{{ true }} {{ false }} {{ none }} {{ 1 }} {{ -3 }} {{ 1.0 }} {{ 2.5e-7 }} {{ 1e16 }} {{ 1/3 }}"},
      {"print_containers", "{{ [1, 'a', none, true, 1.5, {'k': 'v'}, []] }} {{ (1,) }} {{ () }} {{ {'a': [1, {'b': none}]} }}"},
      {"print_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'back\\\\slash', 'nl\\n'] }}"},
      {"print_tuple_expr", "{{ 1, 2 }}"},
      {"print_undefined", "[{{ missing }}][{{ missing | default('d') }}]"},
      {"print_unicode_repr", "{{ ['é', '日本', '😀', 'a\\u200bb', '\\x00'] }}"},
      // String literals and escapes.
      {"escapes", "{{ 'a\\tb\\\\c\\'d\\x41\\u00e9\\U0001F600\\101\\q' }}|{{ \"x\" 'y' }}"},
      // Operators and precedence.
      {"arithmetic", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }}"},
      {"float_ops", "{{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }} {{ 1e300 * 1e10 }} {{ 2 ** -1 }} {{ 10 - 2.5 }}"},
      {"unary", "{{ -2 | abs }} {{ - 3 + 1 }} {{ not true or true }} {{ not (true or true) }} {{ -(2 ** 2) }}"},
      {"concat", "{{ 'a' ~ 1 ~ none ~ true ~ missing }} {{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ 'ab' * 3 }} {{ 2 * [0] }}"},
      {"compare", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ [1, 2] < [1, 3] }} {{ true == 1 }}"},
      {"in_ops", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }}"},
      {"and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }}"},
      {"ternary", "{{ 'y' if 1 else 'n' }} {{ 'y' if 0 else 'n' }} [{{ 'y' if 0 }}] {{ 'a' if false else 'b' if true else 'c' }}"},
      {"filter_binds_tight", "{{ 'ab' ~ 'cd' | upper }} {{ [3, 1] | sort | first }} {{ 1 + [1, 2] | length }}"},
      // Containers, subscripts, slices.
      {"subscripts", "{{ messages[0].role }} {{ messages[1]['content'] }} {{ messages[-1].content }} {{ messages.0.role }}", {{"messages", msgs}}},
      {"slices", "{{ [1,2,3,4][1:] }} {{ [1,2,3,4][:-1] }} {{ [1,2,3,4][::-1] }} {{ [1,2,3,4][::2] }} {{ 'hello'[1:3] }} {{ 'héllo'[::-1] }} {{ [1,2,3][5:] }}"},
      {"slice_messages", "{% for m in messages[1:] %}{{ m.role }},{% endfor %}{% for m in messages[::-1] %}{{ loop.index }}{{ m.role }};{% endfor %}", {{"messages", msgs}}},
      {"string_index", "{{ 'héllo'[1] }} {{ 'abc'[-1] }} [{{ 'abc'[10] }}]"},
      {"dict_literal", "{% set d = {'b': 1, 'a': 2} %}{{ d }} {{ d.b }} {{ d['a'] }} {{ d | length }} {% for k in d %}{{ k }}{% endfor %}"},
      {"dict_methods", "{% set d = {'b': 1, 'a': 2} %}{{ d.items() | list }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 7) }}{% for k, v in d.items() %}[{{ k }}={{ v }}]{% endfor %}"},
      // Statements.
      {"if_elif_else", "{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %} {% endfor %}"},
      {"for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}x{% else %}empty{% endfor %}"},
      {"for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}"},
      {"loop_vars", "{% for x in 'abc' %}{{ loop.index0 }}{{ loop.index }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}"},
      {"loop_prev_next_cycle", "{% for x in [1, 2, 3] %}{{ loop.previtem | default('-') }}{{ loop.nextitem | default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}"},
      {"nested_loops", "{% for a in [1, 2] %}{% for b in [3, 4] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}"},
      // `loop` read only inside nested statements (the evaluator builds it only when the body reads it).
      {"loop_in_nested_statements", "{% for x in [1, 2, 3] %}{% if x > 1 %}{% set y %}{{ loop.index }}{% endset %}{% with z = loop.revindex %}{{ y }}{{ z }}{% endwith %}{% endif %}{% filter upper %}{{ 'abc'[loop.index0] }}{% endfilter %}{% endfor %}"},
      {"loop_in_inner_filter_and_macro", "{% for x in [1, 2] %}{% macro m() %}{{ loop.index }}{% endmacro %}{{ m() }}{% for y in [5, 6] if loop is defined %}{{ y }}{% endfor %}{% endfor %}"},
      {"loop_unread_stays_undefined", "{% for x in [1, 2] %}{% for y in [3] %}{{ x }}{{ y }}{% endfor %}{% endfor %}[{{ loop is defined }}]"},
      {"break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}"},
      {"loop_scoping", "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }};{% endfor %}{{ x }}"},
      {"if_scoping", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}"},
      {"unpack", "{% for a, b in [[1, 2], [3, 4]] %}{{ a }}{{ b }}{% endfor %}{% set p, q = 'xy' %}{{ q }}{{ p }}"},
      {"namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in range(4) %}{% set ns.count = ns.count + x %}{% endfor %}{% set ns.extra = 'e' %}{{ ns.count }}{{ ns.found }}{{ ns.extra }}"},
      {"set_block", "{% set block %}a {{ 1 + 1 }}\n{% endset %}[{{ block }}]"},
      {"macros", "{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(punct='.', name='c') }} [{{ greet() }}]"},
      {"macro_scope", "{% set outer = 'o' %}{% macro m() %}{{ outer }}{% set outer = 'i' %}{{ outer }}{% endmacro %}{{ m() }}{{ outer }}"},
      {"with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"},
      {"filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}"},
      // Filters.
      {"filters_text", "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'aBc' | upper }}|{{ 'aBc' | lower }}|{{ 'hello wORLD' | title }}|{{ 'hello World' | capitalize }}|{{ 'abc' | length }}|{{ 'héé' | count }}"},
      {"filters_default", "{{ missing | d('x') }} {{ '' | default('y') }} {{ '' | default('y', true) }} {{ none | default('z') }} {{ 0 | default(5, boolean=true) }}"},
      {"filters_lists", "{{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ [3, 1, 2] | sort(reverse=true) }} {{ [1, 2] | reverse | list }} {{ 'abc' | reverse }} {{ [1, 1, 2, 'a', 'A'] | unique | list }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ 'ab' | list }}"},
      {"filters_join", "{{ [1, 'a', none] | join(', ') }} {{ ['x', 'y'] | join }} {{ messages | map(attribute='role') | join('/') }}", {{"messages", msgs}}},
      {"filters_select", "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | list }} {{ messages | rejectattr('role', 'eq', 'system') | list | length }} {{ [0, 1, 2, 3] | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 2, 3] | reject('even') | list }}", {{"messages", msgs}}},
      {"filters_map_filter", "{{ ['a', 'b'] | map('upper') | list }} {{ [' a ', 'b '] | map('trim') | join('|') }}"},
      {"filters_numbers", "{{ '42' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '3.5' | float }} {{ 2 | float }} {{ -3 | abs }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.675 | round(2) }} {{ 2.1 | round(0, 'ceil') }} {{ 5 | round }} {{ '0x1A' | int(base=16) }}"},
      {"filters_items_string", "{{ {'a': 1} | items | list }} {{ 12 | string }} {{ [1] | string }} {{ none | string }}"},
      {"filters_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'abc' | replace('', '-') }}"},
      {"filters_indent", "{{ 'a\nb\n\nc' | indent }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}"},
      {"filters_misc", "{{ 'one two  three' | wordcount }} {{ '<a&b>' | e }} {{ '<x>' | safe }} {{ [1, 5, 3] | max }} {{ [4, 2, 8] | min }} {{ [1, 2, 3] | sum }}"},
      {"tojson", "{{ {'a': [1, 2.5, true, none, 'é\"\\n'], 'b': {}} | tojson }}|{{ [] | tojson }}|{{ 'x' | tojson }}"},
      {"tojson_indent", "{{ {'a': [1, {'b': 2}], 'c': []} | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}|{{ [1, 2] | tojson(separators=(',', ':')) }}"},
      {"tojson_tools", "{% for t in tools %}{{ t | tojson }}\n{% endfor %}", {{"tools", nlohmann::json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Wetter für eine Stadt","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])")}}},
      // Tests.
      {"tests_types", "{% for v in [1, 1.5, 'a', none, true, [1], {'a': 1}] %}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is none }}{{ v is boolean }}{{ v is mapping }}{{ v is iterable }}{{ v is sequence }};{% endfor %}"},
      {"tests_misc", "{{ x is defined }} {{ x is undefined }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ 2 is in [1, 2] }} {{ 1 is eq 1 }} {{ 1 is equalto 2 }} {{ true is true }} {{ 0 is false }} {{ none is not none }} {{ 3 is gt 2 }} {{ 'a' is ne 'b' }}"},
      {"not_precedence", "{{ not x is defined }} {{ not 1 in [1] }} {{ not 1 == 2 }}"},
      // String methods.
      {"str_methods", "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a.b.c'.rsplit('.', 1) }} {{ '  x  '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x  '.rstrip() }}|"},
      {"str_methods2", "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith(('lo', 'x')) }} {{ 'aXa'.replace('a', 'b') }} {{ 'abc'.upper() }} {{ 'ABC'.lower() }} {{ 'abcabc'.find('c') }} {{ 'abcabc'.count('bc') }} {{ '-'.join(['a', 'b']) }} {{ 'ab cd'.title() }} {{ '12'.isdigit() }}"},
      {"think_split", "{% set c = 'pre<think>\\nreason\\n</think>\\n\\nanswer' %}{{ c.split('</think>')[-1].lstrip('\\n') }}|{{ c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') }}"},
      // Errors: kvlm must fail where jinja2 does.
      {"err_raise", "{{ raise_exception('bad role') }}"},
      {"err_undefined_attr", "{{ missing.attr }}"},
      {"err_undefined_item_chain", "{{ [1][5].x }}"},
      {"err_type_add", "{{ 1 + 'a' }}"},
      {"err_undefined_add", "{{ missing + 'a' }}"},
      {"err_compare", "{{ 1 < 'a' }}"},
      {"err_div_zero", "{{ 1 // 0 }}"},
      {"err_macro_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}"},
      {"err_tojson_undefined", "{{ missing | tojson }}"},
      {"err_unknown_filter", "{{ 1 | no_such_filter }}"},
      {"err_syntax", "{% if %}"},
      {"err_unclosed", "{% for x in y %}"},
      {"err_unterminated_string", "{{ 'abc }}"},
      {"err_range_too_big", "{{ range(200000) | length }}"},
      {"err_not_callable", "{{ 1() }}"},
      {"err_namespace_assign", "{% set x = 1 %}{% set x.a = 2 %}"},
  };
}

TEST(JinjaFeaturesTest, EveryFeatureMatchesJinja2) {
  KVLM_REQUIRE_JINJA_ORACLE();
  const std::vector<FeatureCase> features = feature_cases();
  std::vector<OracleCase> cases;
  for (const FeatureCase& f : features) cases.push_back({f.source, f.context});
  const auto expected = testing::run_oracle(cases, "JinjaFeaturesTest");
  ASSERT_EQ(expected.size(), features.size());
  int num_matched = 0;
  for (size_t i = 0; i < features.size(); ++i) {
    SCOPED_TRACE(features[i].name);
    auto parsed = ChatTemplate::parse(features[i].source);
    Result<std::string> rendered = parsed.ok() ? parsed->render(features[i].context) : Result<std::string>(parsed.status());
    if (expected[i].ok) {
      ASSERT_TRUE(rendered.ok()) << features[i].name << ": jinja2 rendered [" << expected[i].output
                                 << "] but kvlm failed: " << rendered.status().message();
      EXPECT_EQ(*rendered, expected[i].output) << features[i].name << "\ntemplate: " << features[i].source;
    } else {
      EXPECT_FALSE(rendered.ok()) << features[i].name << ": jinja2 failed (" << expected[i].error
                                  << ") but kvlm rendered [" << *rendered << "]";
    }
    if (!::testing::Test::HasFailure()) ++num_matched;
  }
  EXPECT_EQ(num_matched, static_cast<int>(features.size()));
}

TEST(JinjaFeaturesTest, ErrorsNameThePosition) {
  auto parsed = ChatTemplate::parse("line one\n{% if x %}\n{{ a | }}\n{% endif %}");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("line 3"), std::string::npos) << parsed.status().message();

  auto refused = ChatTemplate::parse("{% include 'other.jinja' %}");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("include"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("line 1, column 4"), std::string::npos) << refused.status().message();

  auto raising = ChatTemplate::parse("{{ raise_exception('Roles must alternate') }}");
  ASSERT_TRUE(raising.ok());
  auto rendered = raising->render(nlohmann::json::object());
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().message(), "chat template raised an exception: Roles must alternate");

  auto undefined = ChatTemplate::parse("\n  {{ message.content }}");
  ASSERT_TRUE(undefined.ok());
  auto failed = undefined->render(nlohmann::json::object());
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("line 2"), std::string::npos) << failed.status().message();
  EXPECT_NE(failed.status().message().find("'message' is undefined"), std::string::npos) << failed.status().message();
}

// Found by fuzz/chat_template_fuzz.cc: values nested without bound overflowed the stack (printing,
// destruction) and a namespace holding itself made every walk over it endless.
TEST(JinjaFeaturesTest, NestingAndCyclesAreRefused) {
  const auto render_error = [](const char* source, const nlohmann::json& context) {
    auto parsed = ChatTemplate::parse(source);
    EXPECT_TRUE(parsed.ok()) << parsed.status().message();
    auto rendered = parsed->render(context);
    EXPECT_FALSE(rendered.ok()) << source;
    return rendered.ok() ? std::string() : rendered.status().message();
  };
  const nlohmann::json empty = nlohmann::json::object();
  EXPECT_NE(render_error("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}"
                         "{% endfor %}{{ ns.x }}",
                         empty)
                .find("nested deeper than 256 levels"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{% set ns.b = ns %}{{ ns }}", empty)
                .find("a namespace attribute cannot hold a namespace"),
            std::string::npos);
  EXPECT_NE(render_error("{% set ns = namespace(a=1) %}{% set ns.b = [1, {'c': ns}] %}", empty)
                .find("cannot hold a namespace"),
            std::string::npos);
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 5000; ++i) deep = nlohmann::json::array({deep});
  EXPECT_NE(render_error("{{ messages }}", {{"messages", deep}}).find("context is nested deeper than 256 levels"),
            std::string::npos);
  // Within the cap, nesting renders as jinja2 prints it.
  auto shallow = ChatTemplate::parse("{% set x = [[[1]]] %}{{ x }}");
  ASSERT_TRUE(shallow.ok());
  EXPECT_EQ(shallow->render(empty).value(), "[[[1]]]");
}

}  // namespace
}  // namespace kvlm::chat
