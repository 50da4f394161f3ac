#include "runtime/core/tensor_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "runtime/format/error.h"

namespace stagecraft::rt {

namespace {

template <class Dst, class Field>
void copy_field(Tensor& t, const Field& field, const std::string& what) {
  if (field.size() != t.numel())
    fail(ErrorKind::kFormat, "{} holds {} values for shape {}", what, field.size(),
         shape_string(t.shape));
  Dst* out = t.as<Dst>();
  for (int i = 0; i < field.size(); ++i) out[i] = static_cast<Dst>(field.Get(i));
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& proto, const std::string& what) {
  auto dtype = dtype_from_onnx(proto.data_type());
  if (!dtype || dtype_size(*dtype) <= 0)
    fail(ErrorKind::kUnsupported, "{} has element type {}, which the runtime does not handle", what,
         proto.data_type());
  if (proto.data_location() == onnx::TensorProto::EXTERNAL)
    fail(ErrorKind::kUnsupported,
         "{} keeps its data in an external file; stage files embed their weights", what);
  Shape shape(proto.dims().begin(), proto.dims().end());
  // Check the data's size before allocating: a file that is not a tensor can claim any dims.
  int64_t count = shape_numel(shape);
  if (count > INT64_MAX / 16)
    fail(ErrorKind::kFormat, "{} claims shape {}, too large", what, shape_string(shape));
  int64_t given =
      proto.has_raw_data()
          ? static_cast<int64_t>(proto.raw_data().size()) / dtype_size(*dtype)
          : std::max({proto.float_data_size(), proto.double_data_size(), proto.int64_data_size(),
                      proto.uint64_data_size(), proto.int32_data_size()});
  if (given != count)
    fail(ErrorKind::kFormat, "{} holds {} values for {}{} ({} values)", what, given,
         dtype_name(*dtype), shape_string(shape), count);
  Tensor t = Tensor::owned(*dtype, shape);
  if (proto.has_raw_data()) {
    if (static_cast<int64_t>(proto.raw_data().size()) != t.bytes())
      fail(ErrorKind::kFormat, "{} has {} bytes of data for {} ({} bytes)", what,
           proto.raw_data().size(), t.describe(), t.bytes());
    if (t.bytes() > 0) std::memcpy(t.data, proto.raw_data().data(), static_cast<size_t>(t.bytes()));
    return t;
  }
  switch (*dtype) {
    case DType::kFloat32:
      copy_field<float>(t, proto.float_data(), what);
      break;
    case DType::kFloat64:
      copy_field<double>(t, proto.double_data(), what);
      break;
    case DType::kInt64:
      copy_field<int64_t>(t, proto.int64_data(), what);
      break;
    case DType::kUInt64:
      copy_field<uint64_t>(t, proto.uint64_data(), what);
      break;
    case DType::kUInt32:
      copy_field<uint32_t>(t, proto.uint64_data(), what);
      break;
    case DType::kInt32:
      copy_field<int32_t>(t, proto.int32_data(), what);
      break;
    case DType::kInt16:
      copy_field<int16_t>(t, proto.int32_data(), what);
      break;
    case DType::kUInt16:
    case DType::kFloat16:
    case DType::kBFloat16:
      copy_field<uint16_t>(t, proto.int32_data(), what);
      break;
    case DType::kInt8:
      copy_field<int8_t>(t, proto.int32_data(), what);
      break;
    case DType::kUInt8:
    case DType::kBool:
      copy_field<uint8_t>(t, proto.int32_data(), what);
      break;
    default:
      fail(ErrorKind::kUnsupported, "{} has element type {}", what, dtype_name(*dtype));
  }
  return t;
}

Tensor read_tensor_pb(const std::string& path, std::string* name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open", path);
  onnx::TensorProto proto;
  if (!proto.ParseFromIstream(&in)) fail(ErrorKind::kFormat, "{}: not an ONNX TensorProto", path);
  if (name) *name = proto.name();
  return tensor_from_proto(proto, path);
}

namespace {

struct NpyType {
  const char* descr;
  DType dtype;
};
constexpr NpyType kNpyTypes[] = {
    {"<f4", DType::kFloat32}, {"<f8", DType::kFloat64}, {"<i8", DType::kInt64},
    {"<i4", DType::kInt32},   {"<i2", DType::kInt16},   {"|i1", DType::kInt8},
    {"|u1", DType::kUInt8},   {"<u2", DType::kUInt16},  {"<u4", DType::kUInt32},
    {"<u8", DType::kUInt64},  {"|b1", DType::kBool},    {"<f2", DType::kFloat16},
};

}  // namespace

Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kIo, "{}: cannot open", path);
  char magic[8];
  if (!in.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0)
    fail(ErrorKind::kFormat, "{}: not a .npy file (bad magic)", path);
  uint32_t header_len = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    if (!in.read(reinterpret_cast<char*>(b), 2))
      fail(ErrorKind::kFormat, "{}: truncated header", path);
    header_len = b[0] | (b[1] << 8);
  } else if (magic[6] == 2 || magic[6] == 3) {
    unsigned char b[4];
    if (!in.read(reinterpret_cast<char*>(b), 4))
      fail(ErrorKind::kFormat, "{}: truncated header", path);
    header_len = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  } else {
    fail(ErrorKind::kFormat, "{}: .npy version {} is not supported", path,
         static_cast<int>(magic[6]));
  }
  if (header_len > (1u << 20))
    fail(ErrorKind::kFormat, "{}: header of {} bytes is too long", path, header_len);
  std::string header(header_len, '\0');
  if (!in.read(header.data(), header_len)) fail(ErrorKind::kFormat, "{}: truncated header", path);

  std::smatch m;
  static const std::regex descr_re(R"('descr'\s*:\s*'([^']*)')");
  static const std::regex order_re(R"('fortran_order'\s*:\s*(True|False))");
  static const std::regex shape_re(R"('shape'\s*:\s*\(([^)]*)\))");
  if (!std::regex_search(header, m, descr_re))
    fail(ErrorKind::kFormat, "{}: header has no 'descr'", path);
  std::string descr = m[1];
  if (descr == "=f4") descr = "<f4";
  if (!std::regex_search(header, m, order_re))
    fail(ErrorKind::kFormat, "{}: header has no 'fortran_order'", path);
  if (m[1] == "True")
    fail(ErrorKind::kUnsupported, "{}: Fortran-order arrays are not supported; save with C order",
         path);
  if (!std::regex_search(header, m, shape_re))
    fail(ErrorKind::kFormat, "{}: header has no 'shape'", path);
  Shape shape;
  {
    std::string dims = m[1];
    std::stringstream ss(dims);
    std::string item;
    while (std::getline(ss, item, ',')) {
      auto first = item.find_first_not_of(" \t");
      if (first == std::string::npos) continue;
      try {
        size_t used = 0;
        long long v = std::stoll(item.substr(first), &used);
        if (v < 0) throw std::invalid_argument("negative");
        shape.push_back(v);
      } catch (const std::exception&) {
        fail(ErrorKind::kFormat, "{}: bad shape '({})'", path, dims);
      }
    }
  }
  const NpyType* type = nullptr;
  for (const NpyType& t : kNpyTypes)
    if (descr == t.descr) type = &t;
  if (type == nullptr)
    fail(ErrorKind::kUnsupported,
         "{}: dtype '{}' is not supported (little-endian numbers and bool)", path, descr);
  Tensor t = Tensor::owned(type->dtype, shape);
  if (t.bytes() > 0 && !in.read(reinterpret_cast<char*>(t.data), t.bytes()))
    fail(ErrorKind::kFormat, "{}: {} needs {} bytes of data; the file is shorter", path,
         t.describe(), t.bytes());
  return t;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  const NpyType* type = nullptr;
  for (const NpyType& t : kNpyTypes)
    if (t.dtype == tensor.dtype) type = &t;
  if (type == nullptr)
    fail(ErrorKind::kUnsupported, "{}: cannot write dtype {} as .npy", path,
         dtype_name(tensor.dtype));
  std::string dims;
  for (int64_t d : tensor.shape) dims += std::to_string(d) + ", ";
  if (tensor.shape.size() > 1)
    dims.resize(dims.size() - 2);
  else if (tensor.shape.size() == 1)
    dims.resize(dims.size() - 1);
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", type->descr, dims);
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorKind::kIo, "{}: cannot write", tmp);
    out.write("\x93NUMPY\x01\x00", 8);
    unsigned char len[2] = {static_cast<unsigned char>(header.size() & 0xff),
                            static_cast<unsigned char>(header.size() >> 8)};
    out.write(reinterpret_cast<const char*>(len), 2);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<const char*>(tensor.data), tensor.bytes());
    if (!out.flush()) fail(ErrorKind::kIo, "{}: write failed (disk full?)", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(ErrorKind::kIo, "{}: cannot rename into place: {}", path, ec.message());
}

}  // namespace stagecraft::rt
