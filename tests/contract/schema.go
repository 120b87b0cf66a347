package main

// The CRD-schema layer: what the API server checks against a CRD's OpenAPI
// schema before any admission webhook sees the object.
//
// Chaos Mesh generates its CRDs with controller-gen from the Go types of the
// api module, so the schema *is* the Go types plus their
// `+kubebuilder:validation:*` markers and the required-field rule (a field is
// required unless its json tag says omitempty or it is marked +optional). The
// markers are comments, not compiled in, so they are read from the pinned
// module's own source in the Go module cache (the same files the checker was
// compiled from) and applied to the object as written.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation/field"

	chaosmesh "github.com/chaos-mesh/chaos-mesh/api/v1alpha1"
)

const chaosMeshAPIModule = "github.com/chaos-mesh/chaos-mesh/api"

// rule is what the markers of one field (or one named type) demand of its value.
type rule struct {
	optional, required, hasDefault, schemaless bool
	enum                                       []string
	min, max                                   *float64
	exclMin, exclMax                           bool
	pattern                                    *regexp.Regexp
	minLen, maxLen, minItems, maxItems         *int64
}

// schemaRules holds the rules of the Go types of some packages, keyed "pkgpath.Type.Field" and "pkgpath.Type".
type schemaRules struct {
	pkgs   map[string]bool
	fields map[string]*rule
	types  map[string]*rule
}

func newSchemaRules(pkgs ...string) *schemaRules {
	s := &schemaRules{pkgs: map[string]bool{}, fields: map[string]*rule{}, types: map[string]*rule{}}
	for _, p := range pkgs {
		s.pkgs[p] = true
	}
	return s
}

// ------------------------------------------------------------------ loading

func loadChaosMeshRules(dir string) (*schemaRules, error) {
	pkg := reflect.TypeOf(chaosmesh.PodChaos{}).PkgPath()
	if dir == "" {
		mod, err := moduleDir(chaosMeshAPIModule)
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(mod, "v1alpha1")
	}
	s := newSchemaRules(pkg)
	if err := s.parseMarkers(dir, pkg); err != nil {
		return nil, err
	}
	if len(s.fields) == 0 {
		return nil, fmt.Errorf("no +kubebuilder markers found in %s", dir)
	}
	return s, nil
}

// moduleDir finds the module-cache directory of a module this binary was built with.
func moduleDir(path string) (string, error) {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information in this binary; pass -api-src")
	}
	for _, m := range bi.Deps {
		if m.Path != path {
			continue
		}
		if m.Replace != nil {
			if m.Replace.Version == "" { // a local directory replacement
				return m.Replace.Path, nil
			}
			m = m.Replace
		}
		dir := filepath.Join(modCache(), escapeModPath(m.Path)+"@"+escapeModPath(m.Version))
		if _, err := os.Stat(dir); err != nil {
			return "", fmt.Errorf("the source of %s@%s (its CRD markers) is not in the Go module cache at %s: "+
				"run `go mod download` in tests/contract, or pass -api-src", m.Path, m.Version, dir)
		}
		return dir, nil
	}
	return "", fmt.Errorf("%s is not among this binary's modules", path)
}

func modCache() string {
	if v := os.Getenv("GOMODCACHE"); v != "" {
		return v
	}
	if out, err := exec.Command("go", "env", "GOMODCACHE").Output(); err == nil {
		if v := strings.TrimSpace(string(out)); v != "" {
			return v
		}
	}
	if gp := os.Getenv("GOPATH"); gp != "" {
		return filepath.Join(filepath.SplitList(gp)[0], "pkg", "mod")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, "go", "pkg", "mod")
}

// escapeModPath is the module cache's case encoding: an upper-case letter becomes '!' and the letter in lower case.
func escapeModPath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

func (s *schemaRules) parseMarkers(dir, pkg string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no Go files in %s", dir)
	}
	fset := token.NewFileSet()
	for _, fn := range files {
		if strings.HasSuffix(fn, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, fn, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				tkey := pkg + "." + ts.Name.Name
				r, err := parseRule(doc)
				if err != nil {
					return fmt.Errorf("%s: type %s: %w", fset.Position(ts.Pos()), ts.Name.Name, err)
				}
				if r != nil {
					s.types[tkey] = r
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				for _, fld := range st.Fields.List {
					r, err := parseRule(fld.Doc)
					if err != nil {
						return fmt.Errorf("%s: %w", fset.Position(fld.Pos()), err)
					}
					if r == nil {
						continue
					}
					names := []string{embeddedName(fld.Type)}
					if len(fld.Names) > 0 {
						names = names[:0]
						for _, n := range fld.Names {
							names = append(names, n.Name)
						}
					}
					for _, n := range names {
						s.fields[tkey+"."+n] = r
					}
				}
			}
		}
	}
	return nil
}

func embeddedName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.StarExpr:
		return embeddedName(t.X)
	}
	return ""
}

func unquote(v string) (string, error) {
	v = strings.TrimSpace(v)
	if strings.HasPrefix(v, `"`) {
		return strconv.Unquote(v)
	}
	if strings.HasPrefix(v, "`") && strings.HasSuffix(v, "`") && len(v) >= 2 {
		return v[1 : len(v)-1], nil
	}
	return v, nil
}

// parseRule reads the markers of one comment group; nil when there is none that matters.
func parseRule(cg *ast.CommentGroup) (*rule, error) {
	if cg == nil {
		return nil, nil
	}
	r, any := &rule{}, false
	for _, c := range cg.List {
		text := strings.TrimSpace(strings.TrimPrefix(c.Text, "//"))
		if !strings.HasPrefix(text, "+") {
			continue
		}
		m := text[1:]
		switch {
		case m == "optional" || m == "kubebuilder:validation:Optional":
			r.optional, any = true, true
		case m == "kubebuilder:validation:Required":
			r.required, any = true, true
		case strings.HasPrefix(m, "kubebuilder:default="):
			r.hasDefault, any = true, true
		case m == "kubebuilder:validation:Schemaless":
			r.schemaless, any = true, true
		case strings.HasPrefix(m, "kubebuilder:validation:"):
			name, val, _ := strings.Cut(strings.TrimPrefix(m, "kubebuilder:validation:"), "=")
			if err := r.set(name, val); err != nil {
				return nil, fmt.Errorf("marker %q: %w", text, err)
			}
			any = true
		}
	}
	if !any {
		return nil, nil
	}
	return r, nil
}

func (r *rule) set(name, val string) error {
	num := func() (*float64, error) {
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		return &f, err
	}
	count := func() (*int64, error) {
		n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
		return &n, err
	}
	var err error
	switch name {
	case "Enum":
		for _, v := range strings.Split(val, ";") {
			u, e := unquote(v)
			if e != nil {
				return e
			}
			r.enum = append(r.enum, u)
		}
	case "Minimum":
		r.min, err = num()
	case "Maximum":
		r.max, err = num()
	case "ExclusiveMinimum":
		r.exclMin = strings.TrimSpace(val) == "true"
	case "ExclusiveMaximum":
		r.exclMax = strings.TrimSpace(val) == "true"
	case "Pattern":
		var src string
		if src, err = unquote(val); err == nil {
			r.pattern, err = regexp.Compile(src)
		}
	case "MinLength":
		r.minLen, err = count()
	case "MaxLength":
		r.maxLen, err = count()
	case "MinItems":
		r.minItems, err = count()
	case "MaxItems":
		r.maxItems, err = count()
	default:
		// Type, Format, XPreserveUnknownFields, ...: shape markers that strict decoding already covers
	}
	return err
}

// ----------------------------------------------------------------- checking

// validateJSON applies the rules to an object as written (JSON) along the Go type of obj.
func (s *schemaRules) validateJSON(js []byte, obj any) field.ErrorList {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	var raw any
	if err := dec.Decode(&raw); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return field.ErrorList{field.TypeInvalid(field.NewPath("<root>"), raw, "must be an object")}
	}
	return s.walkStruct(nil, m, reflect.TypeOf(obj).Elem())
}

type jsonField struct {
	name, goName, owner string
	typ                 reflect.Type
	omitempty           bool
}

// jsonFields lists a struct's JSON fields, inlining embedded structs as encoding/json does.
func jsonFields(t reflect.Type) []jsonField {
	var out []jsonField
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				out = append(out, jsonFields(ft)...)
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name: name, goName: f.Name, owner: t.PkgPath() + "." + t.Name(), typ: f.Type,
			omitempty: slices.Contains(strings.Split(opts, ","), "omitempty")})
	}
	return out
}

func typeKey(t reflect.Type) string { return t.PkgPath() + "." + t.Name() }

func (s *schemaRules) walkStruct(path *field.Path, m map[string]any, t reflect.Type) field.ErrorList {
	var errs field.ErrorList
	for _, f := range jsonFields(t) {
		r := s.fields[f.owner+"."+f.goName]
		p := path.Child(f.name)
		v, present := m[f.name]
		if !present {
			if s.required(f, r) {
				errs = append(errs, field.Required(p, "required by the CRD schema"))
			}
			continue
		}
		if r != nil {
			errs = append(errs, r.check(p, v)...)
			if r.schemaless {
				continue
			}
		}
		errs = append(errs, s.walk(p, v, f.typ)...)
	}
	return errs
}

func (s *schemaRules) required(f jsonField, r *rule) bool {
	if r != nil {
		if r.required {
			return true
		}
		if r.optional || r.hasDefault { // the API server fills a +kubebuilder:default before validating
			return false
		}
	}
	return !f.omitempty
}

func (s *schemaRules) walk(path *field.Path, raw any, t reflect.Type) field.ErrorList {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if raw == nil {
		return nil
	}
	var errs field.ErrorList
	if t.Name() != "" && s.pkgs[t.PkgPath()] {
		if r := s.types[typeKey(t)]; r != nil {
			errs = append(errs, r.check(path, raw)...)
		}
	}
	switch t.Kind() {
	case reflect.Struct:
		if !s.pkgs[t.PkgPath()] {
			return errs // a Kubernetes type (metav1, corev1): strict decoding has checked its shape
		}
		m, ok := raw.(map[string]any)
		if !ok {
			return append(errs, field.TypeInvalid(path, raw, "must be an object"))
		}
		errs = append(errs, s.walkStruct(path, m, t)...)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // []byte, json.RawMessage: not described by the schema
			return errs
		}
		if arr, ok := raw.([]any); ok {
			for i, v := range arr {
				errs = append(errs, s.walk(path.Index(i), v, t.Elem())...)
			}
		}
	case reflect.Map:
		if m, ok := raw.(map[string]any); ok {
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				errs = append(errs, s.walk(path.Key(k), m[k], t.Elem())...)
			}
		}
	}
	return errs
}

func (r *rule) check(p *field.Path, v any) field.ErrorList {
	var errs field.ErrorList
	str, isStr := v.(string)
	num, isNum := v.(json.Number)
	if len(r.enum) > 0 {
		repr := fmt.Sprint(v)
		if !slices.Contains(r.enum, repr) {
			errs = append(errs, field.NotSupported(p, v, r.enum))
		}
	}
	if isNum {
		f, err := num.Float64()
		if err != nil {
			errs = append(errs, field.Invalid(p, v, err.Error()))
		}
		if r.min != nil && (f < *r.min || (r.exclMin && f == *r.min)) {
			op := "greater than or equal to"
			if r.exclMin {
				op = "greater than"
			}
			errs = append(errs, field.Invalid(p, v, fmt.Sprintf("should be %s %v", op, *r.min)))
		}
		if r.max != nil && (f > *r.max || (r.exclMax && f == *r.max)) {
			op := "less than or equal to"
			if r.exclMax {
				op = "less than"
			}
			errs = append(errs, field.Invalid(p, v, fmt.Sprintf("should be %s %v", op, *r.max)))
		}
	}
	if isStr {
		if r.pattern != nil && !r.pattern.MatchString(str) {
			errs = append(errs, field.Invalid(p, str, fmt.Sprintf("should match '%s'", r.pattern)))
		}
		n := int64(utf8.RuneCountInString(str))
		if r.minLen != nil && n < *r.minLen {
			errs = append(errs, field.Invalid(p, str, fmt.Sprintf("should be at least %d chars long", *r.minLen)))
		}
		if r.maxLen != nil && n > *r.maxLen {
			errs = append(errs, field.TooLong(p, str, int(*r.maxLen)))
		}
	}
	if arr, ok := v.([]any); ok {
		if r.minItems != nil && int64(len(arr)) < *r.minItems {
			errs = append(errs, field.Invalid(p, len(arr), fmt.Sprintf("should have at least %d items", *r.minItems)))
		}
		if r.maxItems != nil && int64(len(arr)) > *r.maxItems {
			errs = append(errs, field.TooMany(p, len(arr), int(*r.maxItems)))
		}
	}
	return errs
}
