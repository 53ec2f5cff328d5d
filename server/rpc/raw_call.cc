#include "server/rpc/raw_call.h"

#include <string>
#include <vector>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"

namespace dispatchd::rpc {
namespace {

bool ValidUtf8(const std::string& s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) {
      return false;
    }
    i += len;
  }
  return true;
}

// The path of the first string field of `bytes` (the wire form of a `type`) that holds invalid
// UTF-8, e.g. "spec.labels" or "hello.worker_id"; false if there is none or `bytes` is not
// protobuf at all. Read without the schema's checks, as unknown fields.
bool FindBadUtf8(const std::string& bytes, const google::protobuf::Descriptor* type,
                 const std::string& prefix, std::string* path) {
  google::protobuf::UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return false;
  for (int i = 0; i < fields.field_count(); ++i) {
    const google::protobuf::UnknownField& f = fields.field(i);
    if (f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const google::protobuf::FieldDescriptor* field = type->FindFieldByNumber(f.number());
    if (field == nullptr) continue;
    const std::string name = prefix + field->name();
    if (field->type() == google::protobuf::FieldDescriptor::TYPE_STRING &&
        !ValidUtf8(f.length_delimited())) {
      *path = name;
      return true;
    }
    // A map's entries are messages of key and value: report the map's name.
    if (field->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE &&
        FindBadUtf8(f.length_delimited(), field->message_type(),
                    field->is_map() ? prefix : name + ".", path)) {
      if (field->is_map()) *path = name;
      return true;
    }
  }
  return false;
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer* raw, google::protobuf::Message* message) {
  if (raw == nullptr) return absl::OkStatus();  // no body: an empty message
  {
    grpc::ByteBuffer copy(*raw);  // shares the slices
    grpc::ProtoBufferReader reader(&copy);
    if (reader.status().ok() && message->ParseFromZeroCopyStream(&reader)) {
      return absl::OkStatus();
    }
  }
  std::vector<grpc::Slice> slices;
  (void)raw->Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  message->Clear();
  std::string path;
  if (FindBadUtf8(bytes, message->GetDescriptor(), "", &path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not valid UTF-8 (string fields must be UTF-8; binary data goes in bytes fields)"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("request: not a valid ", message->GetDescriptor()->full_name(),
                   " (malformed protobuf, ", bytes.size(), " bytes)"));
}

void SerializeTo(const google::protobuf::Message& message, grpc::ByteBuffer* raw) {
  raw->Clear();
  grpc::ProtoBufferWriter writer(raw, grpc::kProtoBufferWriterMaxBufferLength,
                                 static_cast<int>(message.ByteSizeLong()));
  message.SerializeToZeroCopyStream(&writer);
}

}  // namespace dispatchd::rpc
