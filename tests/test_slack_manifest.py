"""deploy/slack-manifest.yml against the fields Slack's app-manifest reference documents (issue 35).

Slack rejects an unknown manifest field only when the app is created; this test finds one here. It also
holds the app to the least scopes: every event needs the scope Slack names for it, and no scope is
there that nothing uses.
"""

from __future__ import annotations

import json
import re

from bot.slack_app import BOT_SCOPES, MANIFEST_PATH, render_manifest
from bot.slack_events import BOT_EVENTS

#: The manifest's documented fields (docs.slack.dev, "App manifest reference"): a dict is a map of
#: known keys, a list of one dict is a list of such maps, ``None`` any scalar or list of scalars.
DOCUMENTED = {
    "_metadata": {"major_version": None, "minor_version": None},
    "display_information": {"name": None, "description": None, "background_color": None, "long_description": None},
    "features": {
        "app_home": {"home_tab_enabled": None, "messages_tab_enabled": None, "messages_tab_read_only_enabled": None},
        "bot_user": {"display_name": None, "always_online": None},
        "shortcuts": [{"name": None, "callback_id": None, "description": None, "type": None}],
        "slash_commands": [
            {"command": None, "url": None, "description": None, "usage_hint": None, "should_escape": None}
        ],
        "unfurl_domains": None,
    },
    "oauth_config": {"redirect_urls": None, "scopes": {"bot": None, "user": None}, "token_management_enabled": None},
    "settings": {
        "allowed_ip_address_ranges": None,
        "event_subscriptions": {"request_url": None, "bot_events": None, "user_events": None},
        "interactivity": {"is_enabled": None, "request_url": None, "message_menu_options_url": None},
        "org_deploy_enabled": None,
        "socket_mode_enabled": None,
        "token_rotation_enabled": None,
        "incoming_webhooks": None,
        "function_runtime": None,
    },
}
#: The scope Slack requires for each bot event (its Events API reference).
EVENT_SCOPES = {
    "app_mention": "app_mentions:read",
    "message.channels": "channels:history",
    "message.groups": "groups:history",
    "message.im": "im:history",
    "app_home_opened": None,
}
#: What the rest of benchbot uses: slash commands, posting and editing, uploads, a DM with the owner of a job
#: asked for in a DM between people (conversations.open).
OTHER_SCOPES = {"commands", "chat:write", "chat:write.public", "files:write", "im:write"}


def _scalar(text: str) -> object:
    if text.startswith('"'):
        return json.loads(text)
    if text in ("true", "false"):
        return text == "true"
    return int(text) if text.isdigit() else text


def parse_manifest(text: str) -> dict:
    """The YAML subset render_manifest writes (maps, lists of scalars or of maps), read strictly."""
    lines = [(len(raw) - len(raw.lstrip(" ")), raw.strip()) for raw in text.splitlines()]
    lines = [(indent, line) for indent, line in lines if line and not line.startswith("#")]

    def block(i: int, indent: int) -> tuple[object, int]:
        if lines[i][1].startswith("- "):
            items: list[object] = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                rest = lines[i][1][2:]
                if re.match(r"^[\w.-]+:( |$)", rest):
                    lines[i] = (indent + 2, rest)  # "- key: value": a map whose first key is on the dash line
                    value, i = block(i, indent + 2)
                    items.append(value)
                else:
                    items.append(_scalar(rest))
                    i += 1
            return items, i
        out: dict[str, object] = {}
        while i < len(lines) and lines[i][0] == indent:
            key, _, value = lines[i][1].partition(":")
            assert key not in out, f"{key} is given twice"
            value = value.strip()
            if value:
                out[key] = _scalar(value)
                i += 1
            else:
                out[key], i = block(i + 1, lines[i + 1][0])
        assert i == len(lines) or lines[i][0] < indent, f"bad indentation at {lines[i]}"
        return out, i

    manifest, end = block(0, 0)
    assert end == len(lines)
    assert isinstance(manifest, dict)
    return manifest


def _check(value: object, schema: object, where: str) -> None:
    if schema is None:
        assert not isinstance(value, dict), f"{where} should be a value"
        if isinstance(value, list):
            assert all(not isinstance(v, dict | list) for v in value), f"{where} should hold values"
        return
    if isinstance(schema, list):
        assert isinstance(value, list), f"{where} should be a list"
        for n, item in enumerate(value):
            _check(item, schema[0], f"{where}[{n}]")
        return
    assert isinstance(schema, dict) and isinstance(value, dict), f"{where} should be a map"
    for key, sub in value.items():
        assert key in schema, f"{where}.{key} is not a field Slack documents"
        _check(sub, schema[key], f"{where}.{key}")


def test_the_manifest_uses_only_documented_fields_and_is_current():
    text = MANIFEST_PATH.read_text()
    assert text == render_manifest()
    manifest = parse_manifest(text)
    _check(manifest, DOCUMENTED, "manifest")
    assert len(manifest["display_information"]["name"]) <= 35
    for command in manifest["features"]["slash_commands"]:
        assert len(command["description"]) <= 100 and command["command"].startswith("/")
    assert manifest["features"]["app_home"]["home_tab_enabled"] is True


def test_the_manifest_subscribes_to_exactly_the_events_used_with_the_least_scopes():
    manifest = parse_manifest(MANIFEST_PATH.read_text())
    events = manifest["settings"]["event_subscriptions"]["bot_events"]
    scopes = manifest["oauth_config"]["scopes"]["bot"]
    assert events == list(BOT_EVENTS) and set(events) == set(EVENT_SCOPES)
    needed = {scope for scope in EVENT_SCOPES.values() if scope} | OTHER_SCOPES
    assert set(scopes) == needed == set(BOT_SCOPES)
    assert len(scopes) == len(set(scopes))
