"""Persona files: every validation failure is reported with its file, persona, line and a precise
message; the user directory overrides the shipped one; `sabre personas check` reports the same."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli import cli
from app.config import Settings
from app.personas import loader
from app.personas.loader import (
    SHIPPED_DIR,
    PersonaCheck,
    PersonaError,
    check_personas,
    load_persona_file,
    load_personas,
)
from app.personas.service import load_configured_personas

MINIMAL = """\
name: {name}
identity: You are a test agent.
"""


def write(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(textwrap.dedent(body), encoding="utf-8")
    return path


def check_one(tmp_path: Path, body: str, *, name: str = "p") -> PersonaCheck:
    path = write(tmp_path, name, body)
    return check_personas(path, require_default=False)


def only_error(check: PersonaCheck) -> str:
    assert len(check.errors) == 1, [str(p) for p in check.problems]
    return str(check.errors[0])


# -- the happy paths ------------------------------------------------------------------------------


def test_shipped_personas_load_without_errors() -> None:
    check = check_personas(SHIPPED_DIR)
    assert check.errors == []
    assert set(check.personas) == {
        "default",
        "web-researcher",
        "coder",
        "data-analyst",
        "tau2-retail",
        "tau2-airline",
    }
    # Only helpers the helper library has not registered yet may be warned about.
    assert all("is not available in this build" in str(w) for w in check.warnings)


def test_name_defaults_to_the_file_name(tmp_path: Path) -> None:
    persona = load_persona_file(write(tmp_path, "helper-bot", "identity: You help.\n"))
    assert persona.name == "helper-bot"
    assert persona.featured_helpers == ("*",)


def test_seed_style_examples_and_custom_tools_mapping_are_accepted(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "seedish",
        """\
        identity: You look up users.
        examples: |
          ## Example Workflows

          <helpers>
          uid = find_user(zip="90210")
          </helpers>
        custom_tools:
          find_user:
            description: Find a user by zip.
            execution_mode: external
            parameters:
              type: object
              properties: {zip: {type: string}}
              required: [zip]
        """,
    )
    persona = load_persona_file(path)
    assert len(persona.examples) == 1
    assert persona.custom_tools[0].name == "find_user"
    assert persona.custom_tools[0].execution_mode == "external"


# -- each validation failure ----------------------------------------------------------------------


def test_unknown_key_names_key_line_and_suggestion(tmp_path: Path) -> None:
    check = check_one(tmp_path, "name: p\nidentity: x\ndescripton: typo\n")
    assert only_error(check) == (
        f"{tmp_path / 'p.yaml'}:3: persona 'p': unknown key 'descripton' (did you mean 'description'?)"
    )


def test_unknown_nested_key_names_its_parent(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nlimits:\n  cpu_seconds: 2\n  gpus: 1\n")
    assert only_error(check).endswith(":4: persona 'p': unknown key 'gpus' in limits")


def test_missing_identity(tmp_path: Path) -> None:
    check = check_one(tmp_path, "name: p\ndescription: no identity\n")
    assert only_error(check) == f"{tmp_path / 'p.yaml'}:1: persona 'p': missing required key 'identity'"


def test_blank_identity(tmp_path: Path) -> None:
    check = check_one(tmp_path, 'name: p\nidentity: "   "\n')
    assert only_error(check).endswith(
        ":2: persona 'p': identity: must not be empty: say who the agent is and how it works"
    )


def test_unknown_featured_helper_with_suggestion(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nfeatured_helpers:\n  - llm_call\n  - llm_cal\n")
    assert only_error(check).endswith(
        ":4: persona 'p': featured_helpers[1]: no helper or custom tool named 'llm_cal' "
        "(did you mean 'llm_call'?)"
    )


def test_featured_helpers_accept_star_helpers_and_own_tools(tmp_path: Path) -> None:
    check = check_one(
        tmp_path,
        """\
        identity: x
        featured_helpers: ["*", result, lookup]
        custom_tools:
          - {name: lookup, description: Look up., execution_mode: external}
        """,
    )
    assert check.problems == []


def test_featured_helper_of_the_pending_library_is_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole library of issue 4 is registered now; the mechanism stays for the next helper.
    monkeypatch.setattr(loader, "PENDING_HELPERS", frozenset({"Later.helper"}))
    check = check_one(tmp_path, "identity: x\nfeatured_helpers: [Later.helper]\n")
    assert check.errors == []
    assert [str(w) for w in check.warnings] == [
        f"{tmp_path / 'p.yaml'}:2: warning: persona 'p': featured helper 'Later.helper' is not "
        "available in this build; it is left out of the prompt until it is"
    ]
    assert "p" in check.personas


def test_example_that_does_not_parse_reports_the_line_in_the_file(tmp_path: Path) -> None:
    body = """\
    identity: x
    examples:
      - |
        ### Broken

        <helpers>
        total = 1
        print(total +
        </helpers>
    """
    check = check_one(tmp_path, body)
    # Line 8 of the file is `print(total +`.
    assert (tmp_path / "p.yaml").read_text().splitlines()[7].strip() == "print(total +"
    assert only_error(check).endswith(
        ":8: persona 'p': examples[0]: <helpers> block does not parse: '(' was never closed"
    )


def test_second_block_of_a_seed_style_example_is_located(tmp_path: Path) -> None:
    body = """\
    identity: x
    examples: |
      <helpers>
      ok = 1
      </helpers>

      <helpers>
      def broken(:
          pass
      </helpers>
    """
    check = check_one(tmp_path, body)
    assert only_error(check).endswith(
        ":8: persona 'p': examples: <helpers> block does not parse: invalid syntax"
    )


def test_example_in_a_quoted_string_reports_its_line_within_the_example(tmp_path: Path) -> None:
    check = check_one(tmp_path, 'identity: x\nexamples: ["text\\n<helpers>\\nx = = 1\\n</helpers>"]\n')
    assert only_error(check).endswith(
        ":2: persona 'p': examples[0]: <helpers> block does not parse: invalid syntax (line 3 of the example)"
    )


def test_unclosed_helpers_block(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nexamples:\n  - |\n    intro\n    <helpers>\n    x = 1\n")
    assert only_error(check).endswith(
        ":5: persona 'p': examples[0]: a <helpers> block is never closed with </helpers>"
    )


def test_name_must_match_the_file_name(tmp_path: Path) -> None:
    check = check_one(tmp_path, "name: other\nidentity: x\n")
    assert only_error(check).endswith(
        ":1: persona 'other': name 'other' does not match the file name 'p.yaml' "
        "(a persona is found, and overridden, by its file name)"
    )


def test_invalid_yaml_reports_its_line(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nexamples: [unclosed\nfeatured_helpers: []\n")
    message = only_error(check)
    assert message.startswith(f"{tmp_path / 'p.yaml'}:")
    assert "not valid YAML" in message


def test_duplicate_keys_are_reported(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nidentity: y\n")
    assert only_error(check).endswith(
        ":2: persona 'p': key 'identity' appears twice (YAML keeps only the last one)"
    )


def test_a_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    check = check_one(tmp_path, "- just\n- a list\n")
    assert only_error(check).endswith(
        ":1: a persona file must be a YAML mapping (name, identity, examples, ...)"
    )


def test_bad_network_host_and_limits(tmp_path: Path) -> None:
    check = check_one(tmp_path, "identity: x\nnetwork: {allow: ['http://x.com']}\nlimits: {memory_mb: 0}\n")
    messages = sorted(str(p).split("persona 'p': ")[1] for p in check.errors)
    assert messages == [
        "limits.memory_mb: Input should be greater than 0",
        "network.allow: 'http://x.com' is not a host name, *.domain wildcard, IP address or CIDR range",
    ]


# -- custom tools ---------------------------------------------------------------------------------

TOOL = """\
identity: x
custom_tools:
  - name: {name}
    description: A tool.
    execution_mode: {mode}
{extra}"""


def tool_check(
    tmp_path: Path, *, name: str = "lookup", mode: str = "external", extra: str = ""
) -> PersonaCheck:
    return check_one(tmp_path, TOOL.format(name=name, mode=mode, extra=textwrap.indent(extra, "    ")))


def test_tool_name_must_be_an_identifier(tmp_path: Path) -> None:
    assert only_error(tool_check(tmp_path, name="get-order")).endswith(
        ":3: persona 'p': custom tool 'get-order'.name: tool name 'get-order' is not a Python identifier"
    )


def test_tool_name_must_not_shadow_a_builtin(tmp_path: Path) -> None:
    assert only_error(tool_check(tmp_path, name="open")).endswith(
        "custom tool 'open'.name: tool name 'open' would shadow the Python builtin open()"
    )


@pytest.mark.parametrize("name", ["result", "llm_call", "FS", "Search"])
def test_tool_name_must_not_be_a_helper(tmp_path: Path, name: str) -> None:
    assert only_error(tool_check(tmp_path, name=name)).endswith(
        f":3: persona 'p': custom tool {name!r} has the name of a helper; choose another name"
    )


def test_tools_declared_twice(tmp_path: Path) -> None:
    body = TOOL.format(name="a", mode="external", extra="") + (
        "  - {name: a, description: again, execution_mode: external}\n"
    )
    assert only_error(check_one(tmp_path, body)).endswith("persona 'p': custom tool 'a' is declared twice")


def test_parameters_must_be_valid_json_schema(tmp_path: Path) -> None:
    extra = "parameters: {type: object, properties: {q: {type: strng}}}\n"
    assert only_error(tool_check(tmp_path, extra=extra)).endswith(
        ":6: persona 'p': custom tool 'lookup'.parameters: not a valid JSON Schema at properties/q/type: "
        "'strng' is not valid under any of the given schemas"
    )


def test_parameters_must_be_an_object_schema(tmp_path: Path) -> None:
    assert only_error(tool_check(tmp_path, extra="parameters: {type: string}\n")).endswith(
        "custom tool 'lookup'.parameters: must be a JSON Schema of type \"object\" "
        "(one property per argument)"
    )


def test_required_parameters_must_be_declared(tmp_path: Path) -> None:
    extra = "parameters: {type: object, properties: {a: {type: string}}, required: [a, b]}\n"
    assert only_error(tool_check(tmp_path, extra=extra)).endswith(
        "custom tool 'lookup'.parameters: required names properties that are not declared: b"
    )


def test_internal_tool_needs_an_implementation(tmp_path: Path) -> None:
    assert only_error(tool_check(tmp_path, mode="internal")).endswith(
        ":3: persona 'p': custom tool 'lookup': an internal tool needs an implementation: "
        "'path/to/file.py::function' or 'mcp://server/tool'"
    )


def test_external_tool_takes_no_implementation(tmp_path: Path) -> None:
    check = tool_check(tmp_path, extra="implementation: mcp://db/query\n")
    assert only_error(check).endswith(
        "custom tool 'lookup': an external tool runs in the caller's environment: remove its implementation"
    )


@pytest.mark.parametrize("ref", ["mcp://server-only", "mcp:///tool", "mcp://server/"])
def test_mcp_reference_needs_server_and_tool(tmp_path: Path, ref: str) -> None:
    check = tool_check(tmp_path, mode="internal", extra=f'implementation: "{ref}"\n')
    assert only_error(check).endswith(
        f"custom tool 'lookup': implementation {ref!r}: "
        "expected mcp://server/tool with a server name and a tool name"
    )


def test_mcp_reference_is_accepted(tmp_path: Path) -> None:
    check = tool_check(tmp_path, mode="internal", extra="implementation: mcp://postgres-mcp/query\n")
    assert check.problems == []
    ref = check.personas["p"].custom_tools[0].ref
    assert ref is not None
    assert ref.kind == "mcp"


def test_implementation_string_must_name_a_file_and_function(tmp_path: Path) -> None:
    check = tool_check(tmp_path, mode="internal", extra="implementation: tools/risk.py\n")
    assert only_error(check).endswith(
        "implementation 'tools/risk.py': expected 'path/to/file.py::function' or 'mcp://server/tool'"
    )


def test_implementation_file_must_exist(tmp_path: Path) -> None:
    check = tool_check(tmp_path, mode="internal", extra="implementation: tools/risk.py::score\n")
    assert only_error(check).endswith(
        f":6: persona 'p': implementation file {str(tmp_path / 'tools' / 'risk.py')!r} does not exist"
    )


def test_implementation_must_define_the_function(tmp_path: Path) -> None:
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "risk.py").write_text("def other():\n    return 1\n")
    check = tool_check(tmp_path, mode="internal", extra="implementation: tools/risk.py::score\n")
    assert only_error(check).endswith(
        ":6: persona 'p': risk.py does not define a function 'score' at top level"
    )


def test_implementation_is_read_not_imported(tmp_path: Path) -> None:
    (tmp_path / "risk.py").write_text(
        "raise SystemExit('imported!')\n\nasync def score(user_id):\n    return 1\n"
    )
    extra = (
        "implementation: risk.py::score\n"
        "parameters: {type: object, properties: {user_id: {type: string}}, required: [user_id]}\n"
    )
    check = tool_check(tmp_path, mode="internal", extra=extra)
    assert check.problems == []
    ref = check.personas["p"].custom_tools[0].ref
    assert ref is not None
    assert ref.kind == "python"


def test_implementation_arguments_must_be_bindable_by_name(tmp_path: Path) -> None:
    (tmp_path / "risk.py").write_text("def score(user_id, /):\n    return 1\n")
    extra = (
        "implementation: risk.py::score\n"
        "parameters: {type: object, properties: {user_id: {type: string}}, required: [user_id]}\n"
    )
    assert only_error(tool_check(tmp_path, mode="internal", extra=extra)).endswith(
        "risk.py::score: argument 'user_id' is positional-only; the tool is called with its arguments by name"
    )


def test_implementation_relative_to_the_persona_file(tmp_path: Path) -> None:
    user_dir = tmp_path / "user"
    (user_dir / "tools").mkdir(parents=True)
    (user_dir / "tools" / "risk.py").write_text("def score(**kwargs):\n    return 0\n")
    path = write(
        user_dir,
        "risky",
        """\
        identity: x
        custom_tools:
          - name: risk
            description: Score a user.
            execution_mode: internal
            implementation: tools/risk.py::score
        """,
    )
    # Loaded personas carry absolute paths: the runtime need not know where the YAML was.
    expected = (user_dir / "tools" / "risk.py").resolve()
    assert load_persona_file(path).custom_tools[0].implementation == f"{expected}::score"


def test_implementation_that_does_not_parse(tmp_path: Path) -> None:
    (tmp_path / "risk.py").write_text("def score(:\n")
    check = tool_check(tmp_path, mode="internal", extra="implementation: risk.py::score\n")
    assert only_error(check).endswith(
        f"implementation file {tmp_path / 'risk.py'}:1 does not parse: invalid syntax"
    )


def test_implementation_signature_must_fit_the_schema(tmp_path: Path) -> None:
    (tmp_path / "risk.py").write_text("def score(user_id, region):\n    return 1\n")
    extra = (
        "implementation: risk.py::score\n"
        "parameters:\n"
        "  type: object\n"
        "  properties: {user_id: {type: string}, days: {type: integer}}\n"
        "  required: [user_id]\n"
    )
    messages = sorted(
        str(p).split("persona 'p': ")[1] for p in tool_check(tmp_path, mode="internal", extra=extra).errors
    )
    assert messages == [
        "risk.py::score: argument 'region' has no default and is not in the schema's properties",
        "risk.py::score: the schema's parameter 'days' is not an argument of the function",
    ]


# -- directories ----------------------------------------------------------------------------------


def test_user_directory_overrides_shipped_personas_by_file_name(tmp_path: Path) -> None:
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    write(shipped, "default", MINIMAL.format(name="default"))
    write(shipped, "coder", "identity: shipped coder\n")
    write(user, "coder", "identity: my own coder\n")
    write(user, "extra", "identity: an extra persona\n")
    personas = load_personas(shipped, user)
    assert sorted(personas) == ["coder", "default", "extra"]
    assert personas["coder"].identity == "my own coder"
    assert personas["default"].identity == "You are a test agent."


def test_a_broken_user_persona_stops_the_load_with_every_problem(tmp_path: Path) -> None:
    user = tmp_path / "user"
    write(user, "one", "identity: x\nbogus: 1\n")
    write(user, "two", "name: two\n")
    with pytest.raises(PersonaError) as caught:
        load_personas(SHIPPED_DIR, user)
    text = str(caught.value)
    assert text.startswith("2 problems in persona files:")
    assert f"{user / 'one.yaml'}:2: persona 'one': unknown key 'bogus'" in text
    assert f"{user / 'two.yaml'}:1: persona 'two': missing required key 'identity'" in text


def test_the_default_persona_is_required(tmp_path: Path) -> None:
    write(tmp_path, "solo", "identity: x\n")
    with pytest.raises(PersonaError, match="the 'default' persona is missing"):
        load_personas(tmp_path)


def test_same_persona_twice_in_one_directory(tmp_path: Path) -> None:
    write(tmp_path, "default", "identity: x\n")
    (tmp_path / "default.yml").write_text("identity: y\n")
    with pytest.raises(PersonaError, match=r"two files define persona 'default': default\.yaml"):
        load_personas(tmp_path)


def test_configured_user_directory(tmp_path: Path) -> None:
    user = tmp_path / "mine"
    write(user, "coder", "identity: my coder\n")
    personas = load_configured_personas(Settings(personas_dir=user))
    assert personas["coder"].identity == "my coder"
    assert "tau2-retail" in personas


def test_explicit_user_directory_must_exist(tmp_path: Path) -> None:
    with pytest.raises(PersonaError, match="SABRE_PERSONAS_DIR is not a directory"):
        load_configured_personas(Settings(personas_dir=tmp_path / "missing"))


def test_default_user_directory_may_be_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "nothing-here"))
    monkeypatch.delenv("SABRE_PERSONAS_DIR", raising=False)
    assert "default" in load_configured_personas(Settings())


# -- the CLI --------------------------------------------------------------------------------------


def test_cli_check_ok(tmp_path: Path) -> None:
    write(tmp_path, "fine", "identity: x\n")
    outcome = CliRunner().invoke(cli, ["personas", "check", str(tmp_path)])
    assert outcome.exit_code == 0, outcome.output
    assert outcome.output.strip().endswith("OK: 1 persona(s): fine")


def test_cli_check_lists_every_problem_and_fails(tmp_path: Path) -> None:
    write(tmp_path, "bad", "identity: x\nfeatured_helpers: [nope]\nextra_key: 1\n")
    outcome = CliRunner().invoke(cli, ["personas", "check", str(tmp_path)])
    assert outcome.exit_code == 1
    bad = tmp_path / "bad.yaml"
    assert (
        f"{bad}:2: persona 'bad': featured_helpers[0]: no helper or custom tool named 'nope'"
        in outcome.output
    )
    assert f"{tmp_path / 'bad.yaml'}:3: persona 'bad': unknown key 'extra_key'" in outcome.output
    assert "2 problem(s) in persona files" in outcome.output


def test_cli_check_defaults_to_what_the_service_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SABRE_PERSONAS_DIR", str(tmp_path))
    write(tmp_path, "mine", "identity: x\n")
    outcome = CliRunner().invoke(cli, ["personas", "check"])
    assert outcome.exit_code == 0, outcome.output
    assert (
        "OK: 7 persona(s): coder, data-analyst, default, mine, tau2-airline, tau2-retail, web-researcher"
        in (outcome.output)
    )


def test_cli_check_resolves_mcp_tools_against_the_servers_file(tmp_path: Path) -> None:
    write(
        tmp_path,
        "tooled",
        """\
        identity: x
        custom_tools:
          - name: query
            description: Run a query.
            execution_mode: internal
            implementation: mcp://warehouse/query
        """,
    )
    servers = tmp_path.parent / f"{tmp_path.name}-mcp_servers.yaml"  # not among the personas
    servers.write_text("servers:\n  other:\n    transport: http\n    url: http://127.0.0.1:9/mcp\n")
    outcome = CliRunner().invoke(cli, ["personas", "check", str(tmp_path), "--mcp-servers", str(servers)])
    assert outcome.exit_code == 1
    assert (
        "persona 'tooled': tool 'query' uses mcp://warehouse/query, but no MCP server 'warehouse' is "
        "configured in mcp_servers.yaml"
    ) in outcome.output
    servers.write_text("servers:\n  warehouse:\n    transport: http\n    url: http://127.0.0.1:9/mcp\n")
    outcome = CliRunner().invoke(cli, ["personas", "check", str(tmp_path), "--mcp-servers", str(servers)])
    assert outcome.exit_code == 0, outcome.output
    missing = CliRunner().invoke(
        cli, ["personas", "check", str(tmp_path), "--mcp-servers", str(tmp_path / "none.yaml")]
    )
    assert missing.exit_code == 1
    assert "none.yaml" in missing.output
