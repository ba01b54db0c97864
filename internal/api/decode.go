package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// maxBody is the largest request body accepted, JSON or raw.
const maxBody = 1 << 20

// decodeStrict decodes a JSON object body into dst, a pointer to a struct
// whose fields carry json tags. An empty body means {}. Every unknown field
// and every value of the wrong type is reported, not just the first, as
// issues with the field's path; null leaves a field unset.
func decodeStrict(body []byte, dst any) []issue {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return []issue{{Path: "", Message: "the body must be a JSON object"}}
		}
		return []issue{{Path: "", Message: "the body is not valid JSON: " + err.Error()}}
	}
	if raw == nil { // the body was null
		return nil
	}
	v := reflect.ValueOf(dst).Elem()
	fields := jsonFields(v.Type())
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var issues []issue
	for _, k := range keys {
		idx, ok := fields[k]
		if !ok {
			issues = append(issues, issue{Path: k, Message: "is not a known field"})
			continue
		}
		val := raw[k]
		if string(bytes.TrimSpace(val)) == "null" {
			continue
		}
		f := v.Field(idx)
		p := reflect.New(f.Type())
		if err := json.Unmarshal(val, p.Interface()); err != nil {
			issues = append(issues, issue{Path: k, Message: typeMessage(f.Type(), err)})
			continue
		}
		f.Set(p.Elem())
	}
	return issues
}

// jsonFields maps the JSON names of t's exported fields to their indexes.
func jsonFields(t reflect.Type) map[string]int {
	out := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = i
	}
	return out
}

// typeMessage says what a field should have held.
func typeMessage(t reflect.Type, err error) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var want string
	switch t.Kind() {
	case reflect.String:
		want = "a string"
	case reflect.Bool:
		want = "a boolean"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint32, reflect.Uint64:
		want = "an integer"
	case reflect.Slice:
		want = "an array of " + kindName(t.Elem())
	case reflect.Map:
		want = "an object of " + kindName(t.Elem())
	default:
		return fmt.Sprintf("has the wrong type (%v)", err)
	}
	return "must be " + want
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "strings"
	case reflect.Int, reflect.Int64:
		return "integers"
	default:
		return t.Kind().String() + "s"
	}
}

// nullField reports whether the JSON object body holds key with the value
// null (which decodeStrict leaves unset, like a missing key).
func nullField(body []byte, key string) bool {
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) != nil {
		return false
	}
	v, ok := raw[key]
	return ok && string(bytes.TrimSpace(v)) == "null"
}
