"""JSON schemas of different shapes for the structured-outputs tests. `BOUNDED` keeps every
string, array and number finite in length (tiny-random's random weights would otherwise write
until max_tokens): patterns, enums, ranges and maxItems."""

NAME = {"type": "string", "pattern": "^[a-z]{1,8}$"}

BOUNDED = {
    "flat": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0,
                                                                     "maximum": 120}},
             "required": ["name", "age"], "additionalProperties": False},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999},
                                                  "name": NAME},
                 "required": ["id", "name"], "additionalProperties": False},
        "active": {"type": "boolean"}},
        "required": ["user", "active"], "additionalProperties": False},
    "array_min_items": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                 "minItems": 2, "maxItems": 4}},
        "required": ["tags"], "additionalProperties": False},
    "enum": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]}},
        "required": ["color", "size"], "additionalProperties": False},
    "integer_range": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5},
                      "minItems": 1, "maxItems": 3},
    "optional": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                  "b": {"type": "boolean"}, "c": {"type": "null"}},
                 "required": ["a"], "additionalProperties": False},
    "any_of": {"type": "object", "properties": {"v": {"anyOf": [
        {"type": "integer", "minimum": 0, "maximum": 99}, {"type": "boolean"},
        {"type": "string", "enum": ["x", "y"]}]}},
        "required": ["v"], "additionalProperties": False},
    "array_of_objects": {"type": "array", "minItems": 1, "maxItems": 2, "items": {
        "type": "object", "properties": {"k": {"enum": ["p", "q"]},
                                         "n": {"type": "integer", "minimum": 0, "maximum": 3}},
        "required": ["k", "n"], "additionalProperties": False}},
    "const_and_bool": {"type": "object", "properties": {"kind": {"const": "point"}, "ok": {"type": "boolean"}},
                       "required": ["kind", "ok"], "additionalProperties": False},
    "one_of_objects": {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"r": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["r"], "additionalProperties": False},
        {"type": "object", "properties": {"w": {"type": "integer", "minimum": 1, "maximum": 9},
                                          "h": {"type": "integer", "minimum": 1, "maximum": 9}},
         "required": ["w", "h"], "additionalProperties": False}]}},
        "required": ["shape"], "additionalProperties": False},
}
