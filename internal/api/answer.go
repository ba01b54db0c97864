package api

import "net/http"

// reply answers v, made wire-shaped by toJSON, as JSON with 200, or
// returns err, the call's failure, untouched for serveRoute to answer in
// the one error shape.
func reply[T, J any](w http.ResponseWriter, v T, err error, toJSON func(T) J) error {
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toJSON(v))
	return nil
}

// replyPage answers a page of items, each made wire-shaped by toJSON, as
// JSON with 200, or returns err untouched.
func replyPage[T, J any](w http.ResponseWriter, items []T, next string, err error, toJSON func(T) J) error {
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, pageOf(items, next, toJSON))
	return nil
}

// pageOf is a page of items, each made wire-shaped by toJSON; next is
// the cursor of the page after it ("" for none).
func pageOf[T, J any](items []T, next string, toJSON func(T) J) listJSON[J] {
	out := listJSON[J]{Data: make([]J, 0, len(items)), NextCursor: optString(next)}
	for _, it := range items {
		out.Data = append(out.Data, toJSON(it))
	}
	return out
}

// dataOf is a short list of items, each made wire-shaped by toJSON from
// its address (the guest answers lists of values).
func dataOf[T, J any](items []T, toJSON func(*T) J) dataJSON[J] {
	data := make([]J, 0, len(items))
	for i := range items {
		data = append(data, toJSON(&items[i]))
	}
	return dataJSON[J]{Data: data}
}
