package api

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
)

// openAPI builds the OpenAPI 3.1 document of the routes in the table, so the
// document lists exactly what the server serves.
func (s *server) openAPI() map[string]any {
	paths := map[string]any{}
	for _, rt := range s.routes {
		item, _ := paths[rt.Path].(map[string]any)
		if item == nil {
			item = map[string]any{}
			paths[rt.Path] = item
		}
		item[strings.ToLower(rt.Method)] = operation(rt)
	}
	return map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "Emberbox API",
			"version":     s.version,
			"description": "Runtime Cloud v1 wire format, as served by Emberbox. Actions use colon verbs in the last path segment (/v1/sandboxes/{id}:stop).",
		},
		"paths": paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer"},
			},
			"schemas": map[string]any{
				"Error":      errorSchema(),
				"Sandbox":    schemaOf(reflect.TypeFor[sandboxJSON]()),
				"Process":    schemaOf(reflect.TypeFor[processJSON]()),
				"FileEntry":  schemaOf(reflect.TypeFor[fileJSON]()),
				"ExecResult": schemaOf(reflect.TypeFor[execResultJSON]()),
			},
		},
		"security": []any{map[string]any{"bearer": []any{}}},
	}
}

func operation(rt route) map[string]any {
	op := map[string]any{"operationId": rt.OpID, "summary": rt.Summary}
	if rt.Public {
		op["security"] = []any{}
	}
	var params []any
	for _, name := range pathParams(rt.Path) {
		params = append(params, map[string]any{"name": name, "in": "path", "required": true,
			"schema": map[string]any{"type": "string"}})
	}
	for _, q := range rt.Query {
		schema := map[string]any{"type": q.Type}
		if q.Repeat {
			schema = map[string]any{"type": "array", "items": map[string]any{"type": q.Type}}
		}
		params = append(params, map[string]any{"name": q.Name, "in": "query", "required": q.Required,
			"description": q.Doc, "schema": schema})
	}
	if rt.Method != http.MethodGet {
		params = append(params, map[string]any{"name": "Idempotency-Key", "in": "header",
			"schema": map[string]any{"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"}})
	}
	if len(params) > 0 {
		op["parameters"] = params
	}
	switch {
	case rt.RawBody:
		op["requestBody"] = map[string]any{"required": true, "content": map[string]any{
			"application/octet-stream": map[string]any{"schema": map[string]any{"type": "string", "format": "binary", "maxLength": maxBody}}}}
	case rt.Body != nil:
		op["requestBody"] = map[string]any{"content": map[string]any{
			"application/json": map[string]any{"schema": schemaOf(reflect.TypeOf(rt.Body))}}}
	}
	answers := rt.Answers
	if len(answers) == 0 {
		answers = []string{"application/json"}
	}
	content := map[string]any{}
	for _, ct := range answers {
		content[ct] = map[string]any{}
	}
	op["responses"] = map[string]any{
		"200": map[string]any{"description": "OK", "content": content},
		"default": map[string]any{"description": "Error", "content": map[string]any{
			"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}},
	}
	return op
}

// pathParams returns the names of a path's wildcards.
func pathParams(path string) []string {
	var out []string
	for {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			return out
		}
		j := strings.IndexByte(path[i:], '}')
		out = append(out, path[i+1:i+j])
		path = path[i+j+1:]
	}
}

func errorSchema() map[string]any {
	return map[string]any{"type": "object", "required": []string{"error"}, "properties": map[string]any{
		"error": map[string]any{"type": "object", "required": []string{"code", "status", "message", "hint", "requestId"},
			"properties": map[string]any{
				"code": map[string]any{"type": "string"}, "status": map[string]any{"type": "integer"},
				"message": map[string]any{"type": "string"}, "hint": map[string]any{"type": "string"},
				"details": map[string]any{"type": "object"}, "requestId": map[string]any{"type": "string"},
				"retryAfterMs": map[string]any{"type": "integer"},
			}}}}
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// schemaOf describes a Go type as JSON Schema, following json tags.
func schemaOf(t reflect.Type) map[string]any {
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	var out map[string]any
	switch {
	case t == rawMessageType:
		return map[string]any{}
	case t == reflect.TypeFor[jsonTime]():
		out = map[string]any{"type": "string", "format": "date-time"}
	case t.Kind() == reflect.String:
		out = map[string]any{"type": "string"}
	case t.Kind() == reflect.Bool:
		out = map[string]any{"type": "boolean"}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		out = map[string]any{"type": "integer"}
	case t.Kind() == reflect.Slice:
		out = map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case t.Kind() == reflect.Map:
		out = map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
	case t.Kind() == reflect.Struct:
		props := map[string]any{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			props[name] = schemaOf(f.Type)
		}
		out = map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	default:
		out = map[string]any{}
	}
	if nullable {
		out["type"] = []any{out["type"], "null"}
	}
	return out
}

func (s *server) serveOpenAPI(w http.ResponseWriter, r *http.Request, c *call) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(s.openapi)
	return nil
}
