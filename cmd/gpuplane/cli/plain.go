package cli

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/fsm/descriptor"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// The CLI's -o json|yaml speaks the descriptor's vocabulary, as kubectl
// does, rather than the API's protojson: enums are the words a descriptor
// and the tables use (shared, onDemand, running; not TENANCY_SHARED), 64-bit
// counts are numbers (not strings), a pinned deployment says pinned (the
// state machine stores the default as unspecified), and an accelerator or a
// deployment is printed as the descriptor document that `apply -f` reads
// back, with its status beside the spec. The raw API keeps protojson.

// plainJSON is the CLI's JSON form of m.
func plainJSON(m proto.Message) ([]byte, error) {
	var v any
	var err error
	switch m := m.(type) {
	case *pb.Accelerator:
		v, err = acceleratorDocument(m)
	case *pb.ModelDeployment:
		v, err = modelDocument(m)
	default:
		v, err = plainMessage(m.ProtoReflect())
	}
	if err != nil {
		return nil, err
	}
	return marshalPlain(v)
}

// marshalPlain is json.Marshal without HTML escaping: a reason such as
// "0.03 < 0.28" stays readable, as protojson left it.
func marshalPlain(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// member is one key of an object, which keeps its keys in the order of the
// message's fields.
type member struct {
	key   string
	value any
}

type object []member

func (o object) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := marshalPlain(m.key)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		v, err := marshalPlain(m.value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.key, err)
		}
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// acceleratorDocument is an accelerator as a descriptor document.
func acceleratorDocument(a *pb.Accelerator) (object, error) {
	status, err := plainMessage(a.GetStatus().ProtoReflect())
	if err != nil {
		return nil, err
	}
	status = append(status, member{"createdIndex", a.GetCreatedIndex()})
	return document(descriptor.KindAccelerator, a.GetName(), descriptor.AcceleratorSpecFromProto(a.GetSpec()), status), nil
}

// modelDocument is a deployment as a descriptor document.
func modelDocument(m *pb.ModelDeployment) (object, error) {
	status, err := plainMessage(m.GetStatus().ProtoReflect())
	if err != nil {
		return nil, err
	}
	status = append(status, member{"generation", m.GetGeneration()}, member{"createdIndex", m.GetCreatedIndex()})
	return document(descriptor.KindModelDeployment, m.GetName(), descriptor.ModelDeploymentSpecFromProto(m.GetSpec()), status), nil
}

func document(kind descriptor.Kind, name string, spec any, status object) object {
	return object{
		{"resource", string(kind)},
		{"resourceVersion", descriptor.ResourceVersion},
		{"metadata", descriptor.Metadata{Name: name}},
		{"spec", spec},
		{"status", status},
	}
}

// plainMessage converts a message field by field, every field present
// (zero values included, as -o json always had them) under its JSON name.
func plainMessage(m protoreflect.Message) (object, error) {
	fields := m.Descriptor().Fields()
	out := make(object, 0, fields.Len())
	for i := range fields.Len() {
		fd := fields.Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && !m.Has(fd) {
			continue
		}
		v, err := plainField(fd, m)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fd.JSONName(), err)
		}
		out = append(out, member{fd.JSONName(), v})
	}
	return out, nil
}

func plainField(fd protoreflect.FieldDescriptor, m protoreflect.Message) (any, error) {
	v := m.Get(fd)
	switch {
	case fd.IsList():
		l := v.List()
		out := make([]any, 0, l.Len())
		for i := range l.Len() {
			e, err := plainValue(fd, l.Get(i))
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	case fd.IsMap():
		type entry struct {
			key string
			val protoreflect.Value
		}
		var entries []entry
		v.Map().Range(func(k protoreflect.MapKey, val protoreflect.Value) bool {
			entries = append(entries, entry{k.String(), val})
			return true
		})
		slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.key, b.key) })
		out := make(object, 0, len(entries))
		for _, e := range entries {
			val, err := plainValue(fd.MapValue(), e.val)
			if err != nil {
				return nil, err
			}
			out = append(out, member{e.key, val})
		}
		return out, nil
	case fd.Message() != nil && !m.Has(fd):
		return nil, nil
	}
	return plainValue(fd, v)
}

// plainValue converts one value of field fd (an element, for a list).
func plainValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) (any, error) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		msg := v.Message()
		if strings.HasPrefix(string(msg.Descriptor().FullName()), "google.protobuf.") {
			// Well-known types (timestamps, durations) keep their JSON
			// form: RFC 3339 times, "1.5s" durations.
			b, err := protojson.Marshal(msg.Interface())
			if err != nil {
				return nil, err
			}
			return json.RawMessage(b), nil
		}
		return plainMessage(msg)
	case protoreflect.EnumKind:
		return enumWord(fd.Enum(), v.Enum()), nil
	case protoreflect.BoolKind:
		return v.Bool(), nil
	case protoreflect.StringKind:
		return v.String(), nil
	case protoreflect.BytesKind:
		return base64.StdEncoding.EncodeToString(v.Bytes()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return v.Int(), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return v.Uint(), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		switch {
		case math.IsNaN(f):
			return "NaN", nil
		case math.IsInf(f, 1):
			return "Infinity", nil
		case math.IsInf(f, -1):
			return "-Infinity", nil
		}
		bits := 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		return json.Number(strconv.FormatFloat(f, 'g', -1, bits)), nil
	}
	return nil, fmt.Errorf("unsupported field kind %s", fd.Kind())
}

// enumWord is the descriptor's word for an enum value: the value's name
// without its enum's prefix, in lower camel case (RESIDENCY_ON_DEMAND is
// onDemand, REPLICA_STATE_RUNNING is running); "" for unspecified, except
// where unspecified stands for a default (residency pinned, priority
// standard); the number for a value this CLI does not know.
func enumWord(ed protoreflect.EnumDescriptor, n protoreflect.EnumNumber) any {
	switch ed.FullName() {
	case pb.Residency(0).Descriptor().FullName():
		if _, known := pb.Residency_name[int32(n)]; known {
			return fsm.ResidencyName(pb.Residency(n))
		}
	case pb.Priority(0).Descriptor().FullName():
		if _, known := pb.Priority_name[int32(n)]; known {
			return fsm.PriorityName(pb.Priority(n))
		}
	}
	vd := ed.Values().ByNumber(n)
	if vd == nil {
		return int32(n)
	}
	name := strings.TrimPrefix(string(vd.Name()), screamingSnake(string(ed.Name()))+"_")
	if name == "UNSPECIFIED" {
		return ""
	}
	return lowerCamel(name)
}

// screamingSnake turns ReplicaState into REPLICA_STATE.
func screamingSnake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if i > 0 && unicode.IsUpper(r) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToUpper(r))
	}
	return b.String()
}

// lowerCamel turns ON_DEMAND into onDemand.
func lowerCamel(s string) string {
	parts := strings.Split(strings.ToLower(s), "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}
