package imagebuild

import (
	"errors"
	"maps"
	"slices"
)

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }

func slices_Keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
