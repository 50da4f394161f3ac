#include "runtime/core/tensor_io.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>

#include "runtime/core/npy_header.h"
#include "runtime/format/checked.h"
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
         "{} keeps its data in an external file, which only a plan's stage files may do", what);
  Shape shape(proto.dims().begin(), proto.dims().end());
  // Check the data's size before allocating: a file that is not a tensor can claim any dims.
  int64_t count = with_context(what, ErrorKind::kFormat, [&] { return shape_numel(shape); });
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

/// The three keys of a .npy header.
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

/// A bounded, hand-written reader of the header's Python dict literal
/// (`{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`): no regex and no recursion
/// on untrusted input, every step moves forward, every number is range-checked.
class NpyHeaderParser {
 public:
  NpyHeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  NpyHeader parse() {
    NpyHeader out;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        out.descr = quoted();
        have_descr = true;
      } else if (key == "fortran_order") {
        out.fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        out.shape = tuple();
        have_shape = true;
      } else {
        bad(fmt::format("unknown key '{}'", key));
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != '}') bad("expected ',' or '}'");
    }
    if (!have_descr) bad("no 'descr'");
    if (!have_order) bad("no 'fortran_order'");
    if (!have_shape) bad("no 'shape'");
    return out;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail(ErrorKind::kFormat, "{}: bad .npy header at byte {}: {}", path_, pos_, why);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) bad(fmt::format("expected '{}'", c));
    ++pos_;
  }
  std::string quoted() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a quoted string");
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    if (end - pos_ - 1 > 64) bad("a string longer than 64 characters");
    std::string out(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool boolean() {
    for (auto [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    bad("expected True or False");
  }
  Shape tuple() {
    Shape shape;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      if (shape.size() >= 64) bad("more than 64 dims");
      int64_t dim = 0;
      const char* first = text_.data() + pos_;
      auto [last, ec] = std::from_chars(first, text_.data() + text_.size(), dim);
      if (ec != std::errc() || dim < 0) bad("a dim is not a non-negative int64");
      pos_ += static_cast<size_t>(last - first);
      while (peek() == 'L') ++pos_;  // Python 2 long suffix
      shape.push_back(dim);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      skip_space();
      if (peek() != ')') bad("expected ',' or ')' in the shape");
    }
    ++pos_;
    return shape;
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

NpyHeader parse_npy_header(std::string_view header, const std::string& path) {
  return NpyHeaderParser(header, path).parse();
}

}  // namespace

NpyArray read_npy_header(const std::string& path) {
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

  const NpyHeader parsed = parse_npy_header(header, path);
  std::string descr = parsed.descr;
  if (descr == "=f4") descr = "<f4";
  if (parsed.fortran_order)
    fail(ErrorKind::kUnsupported, "{}: Fortran-order arrays are not supported; save with C order",
         path);
  const Shape& shape = parsed.shape;
  const NpyType* type = nullptr;
  for (const NpyType& t : kNpyTypes)
    if (descr == t.descr) type = &t;
  if (type == nullptr)
    fail(ErrorKind::kUnsupported,
         "{}: dtype '{}' is not supported (little-endian numbers and bool)", path, descr);
  // The data's size against the file's before anything is allocated: a header can claim any
  // shape, and numel x size is checked for overflow.
  const std::optional<int64_t> need = try_mul(shape_numel(shape), dtype_size(type->dtype));
  const auto data_start = static_cast<int64_t>(in.tellg());
  std::error_code ec;
  const auto file_size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  if (!need || (!ec && *need > file_size - data_start))
    fail(ErrorKind::kFormat, "{}: {}{} needs {} bytes of data; the file is shorter (holds {})",
         path, dtype_name(type->dtype), shape_string(shape),
         need ? std::to_string(*need) : std::string("more than 2^63"),
         ec ? std::string("fewer") : std::to_string(file_size - data_start));
  return {type->dtype, shape, data_start};
}

Tensor read_npy(const std::string& path) {
  const NpyArray array = read_npy_header(path);
  std::ifstream in(path, std::ios::binary);
  if (!in || !in.seekg(array.data_offset)) fail(ErrorKind::kIo, "{}: cannot open", path);
  Tensor t = Tensor::uninitialized(array.dtype, array.shape);
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
