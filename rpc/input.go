package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// MaxRequestIDBytes bounds a request id: every server keeps each id it has
// applied for good, so an id is a short token, not a payload.
const MaxRequestIDBytes = 128

// checkRequestID refuses a request id longer than MaxRequestIDBytes or with
// bytes other than printable ASCII.
func checkRequestID(id string) error {
	var why string
	if len(id) > MaxRequestIDBytes {
		why = fmt.Sprintf("must be at most %d bytes, got %d", MaxRequestIDBytes, len(id))
	} else {
		for i := 0; i < len(id); i++ {
			if id[i] < 0x20 || id[i] > 0x7e {
				why = fmt.Sprintf("must be printable ASCII, got byte 0x%02x at offset %d", id[i], i)
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return invalidArgument(&pb.Violation{Field: "requestId", Description: why})
}

// invalidArgument is an InvalidArgument error listing vs, in its message
// and as a Violations detail, as resultError does.
func invalidArgument(vs ...*pb.Violation) error {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = v.Field + ": " + v.Description
	}
	err := connect.NewError(connect.CodeInvalidArgument, errors.New("invalid request: "+strings.Join(parts, "; ")))
	if d, derr := connect.NewErrorDetail(&pb.Violations{Violations: vs}); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// undefinedEnums lists every enum field of m, at any depth, whose number
// its enum does not define. Protobuf's enums are open, so decoding keeps
// such numbers (binary, or a number in JSON); an API request must not.
func undefinedEnums(m protoreflect.Message, prefix string, out []*pb.Violation) []*pb.Violation {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		path := prefix + fd.JSONName()
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				out = checkValue(fd, l.Get(i), fmt.Sprintf("%s[%d]", path, i), out)
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				out = checkValue(fd.MapValue(), mv, fmt.Sprintf("%s[%q]", path, k.String()), out)
				return true
			})
		default:
			out = checkValue(fd, v, path, out)
		}
		return true
	})
	return out
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string, out []*pb.Violation) []*pb.Violation {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		if ed := fd.Enum(); ed.Values().ByNumber(v.Enum()) == nil {
			out = append(out, &pb.Violation{Field: path, Description: fmt.Sprintf("%d is not a defined %s: must be one of %s", v.Enum(), ed.Name(), enumNames(ed))})
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		out = undefinedEnums(v.Message(), path+".", out)
	}
	return out
}

func enumNames(ed protoreflect.EnumDescriptor) string {
	vs := ed.Values()
	names := make([]string, vs.Len())
	for i := range names {
		names[i] = string(vs.Get(i).Name())
	}
	return strings.Join(names, ", ")
}

// checkEnums refuses a request message holding an undefined enum number.
func checkEnums(msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil
	}
	r := m.ProtoReflect()
	if !hasUndefinedEnum(r) {
		return nil
	}
	if vs := undefinedEnums(r, "", nil); len(vs) > 0 {
		return invalidArgument(vs...)
	}
	return nil
}

// hasUndefinedEnum reports whether undefinedEnums would find anything,
// visiting only the fields through which an enum can be reached and
// building no paths: every API request and every forwarded write passes
// through here, and walking every field by reflection with a path string
// per field showed up in a server's CPU per write (the commit benchmark,
// bench/cluster).
func hasUndefinedEnum(m protoreflect.Message) bool {
	p := enumPlanOf(m.Descriptor())
	for _, fd := range p.fields {
		if m.Has(fd) && undefinedIn(fd, m.Get(fd)) {
			return true
		}
	}
	for _, od := range p.oneofs {
		if fd := m.WhichOneof(od); fd != nil && p.inOneof[fd] && undefinedIn(fd, m.Get(fd)) {
			return true
		}
	}
	return false
}

// undefinedIn reports whether field fd's value v holds an undefined enum
// number, at any depth.
func undefinedIn(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	switch {
	case fd.IsList():
		l := v.List()
		for i := 0; i < l.Len(); i++ {
			if undefinedValue(fd, l.Get(i)) {
				return true
			}
		}
	case fd.IsMap():
		found := false
		v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
			found = undefinedValue(fd.MapValue(), mv)
			return !found
		})
		return found
	default:
		return undefinedValue(fd, v)
	}
	return false
}

func undefinedValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
	if fd.Kind() == protoreflect.EnumKind {
		return fd.Enum().Values().ByNumber(v.Enum()) == nil
	}
	return hasUndefinedEnum(v.Message())
}

// enumPlan is what hasUndefinedEnum visits in a message type: the fields
// that are enums or lead to one (messages, lists and maps of either, at
// any depth); a oneof is looked at through the member that is set, since
// asking each member of a large oneof whether it is set costs more.
type enumPlan struct {
	fields  []protoreflect.FieldDescriptor // outside oneofs
	oneofs  []protoreflect.OneofDescriptor
	inOneof map[protoreflect.FieldDescriptor]bool
}

var enumPlans sync.Map // protoreflect.MessageDescriptor -> *enumPlan

func enumPlanOf(md protoreflect.MessageDescriptor) *enumPlan {
	if p, ok := enumPlans.Load(md); ok {
		return p.(*enumPlan)
	}
	p := &enumPlan{inOneof: map[protoreflect.FieldDescriptor]bool{}}
	all := md.Fields()
	for i := 0; i < all.Len(); i++ {
		fd := all.Get(i)
		v := fd
		if fd.IsMap() {
			v = fd.MapValue()
		}
		if !reachesEnum(v, map[protoreflect.FullName]bool{md.FullName(): true}) {
			continue
		}
		if od := fd.ContainingOneof(); od != nil {
			if !slices.Contains(p.oneofs, od) {
				p.oneofs = append(p.oneofs, od)
			}
			p.inOneof[fd] = true
			continue
		}
		p.fields = append(p.fields, fd)
	}
	enumPlans.Store(md, p)
	return p
}

// reachesEnum reports whether fd is an enum or a message with an enum
// field at some depth. A message type already being looked at (a
// recursive type) counts as reaching one, so that it is walked.
func reachesEnum(fd protoreflect.FieldDescriptor, visiting map[protoreflect.FullName]bool) bool {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		return true
	case protoreflect.MessageKind, protoreflect.GroupKind:
	default:
		return false
	}
	md := fd.Message()
	if visiting[md.FullName()] {
		return true
	}
	visiting[md.FullName()] = true
	defer delete(visiting, md.FullName())
	all := md.Fields()
	for i := 0; i < all.Len(); i++ {
		f := all.Get(i)
		if f.IsMap() {
			f = f.MapValue()
		}
		if reachesEnum(f, visiting) {
			return true
		}
	}
	return false
}

// definedEnums is the interceptor that applies checkEnums to every request
// message, unary or streamed.
type definedEnums struct{}

func (definedEnums) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		if err := checkEnums(req.Any()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (definedEnums) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (definedEnums) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return next(ctx, checkedConn{conn})
	}
}

type checkedConn struct{ connect.StreamingHandlerConn }

func (c checkedConn) Receive(msg any) error {
	if err := c.StreamingHandlerConn.Receive(msg); err != nil {
		return err
	}
	return checkEnums(msg)
}

// strictJSON is protojson as connect decodes it (unknown fields ignored, so
// that older servers take newer clients' requests) except for enum names:
// protojson with DiscardUnknown also drops an unknown enum name, leaving
// the field at its default, so "TENANCY_SHAREDD" would create a dedicated
// accelerator. Here an unknown name is an error naming the field.
type strictJSON struct{ name string }

func (c strictJSON) Name() string { return c.name }

func (c strictJSON) IsBinary() bool { return false }

func (c strictJSON) Marshal(msg any) ([]byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", msg)
	}
	return protojson.Marshal(m)
}

func (c strictJSON) Unmarshal(data []byte, msg any) error {
	m, ok := msg.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", msg)
	}
	if len(data) == 0 {
		return errors.New("zero-length payload is not a valid JSON object")
	}
	// The strict decoder fails on unknown fields and unknown enum names;
	// only when it fails (rare) is the JSON read again to tell which.
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, m); err == nil {
		return nil
	}
	proto.Reset(m)
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, m); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", msg, err)
	}
	var raw any
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", msg, err)
	}
	if vs := unknownEnumNames(m.ProtoReflect().Descriptor(), raw, "", nil); len(vs) > 0 {
		slices.SortFunc(vs, func(a, b *pb.Violation) int { return strings.Compare(a.Field, b.Field) })
		return invalidArgument(vs...)
	}
	return nil
}

// unknownEnumNames walks raw, the JSON of a message md, and lists each
// enum given by a name md's enum does not define.
func unknownEnumNames(md protoreflect.MessageDescriptor, raw any, prefix string, out []*pb.Violation) []*pb.Violation {
	obj, ok := raw.(map[string]any)
	if !ok || strings.HasPrefix(string(md.FullName()), "google.protobuf.") {
		return out // well-known types have JSON forms of their own
	}
	for key, val := range obj {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		if fd == nil {
			continue // an unknown field, ignored
		}
		path := prefix + fd.JSONName()
		switch {
		case fd.IsList():
			items, _ := val.([]any)
			for i, item := range items {
				out = unknownEnumName(fd, item, fmt.Sprintf("%s[%d]", path, i), out)
			}
		case fd.IsMap():
			entries, _ := val.(map[string]any)
			for k, item := range entries {
				out = unknownEnumName(fd.MapValue(), item, fmt.Sprintf("%s[%q]", path, k), out)
			}
		default:
			out = unknownEnumName(fd, val, path, out)
		}
	}
	return out
}

func unknownEnumName(fd protoreflect.FieldDescriptor, val any, path string, out []*pb.Violation) []*pb.Violation {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ed := fd.Enum()
		if name, ok := val.(string); ok && ed.FullName() != "google.protobuf.NullValue" && ed.Values().ByName(protoreflect.Name(name)) == nil {
			out = append(out, &pb.Violation{Field: path, Description: fmt.Sprintf("%q is not a defined %s: must be one of %s", name, ed.Name(), enumNames(ed))})
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		out = unknownEnumNames(fd.Message(), val, path+".", out)
	}
	return out
}
