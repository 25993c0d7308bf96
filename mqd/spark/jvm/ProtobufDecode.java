package mqd.spark;

import com.google.protobuf.ByteString;
import com.google.protobuf.CodedInputStream;
import com.google.protobuf.DescriptorProtos.FileDescriptorProto;
import com.google.protobuf.DescriptorProtos.FileDescriptorSet;
import com.google.protobuf.Descriptors.Descriptor;
import com.google.protobuf.Descriptors.DescriptorValidationException;
import com.google.protobuf.Descriptors.EnumValueDescriptor;
import com.google.protobuf.Descriptors.FieldDescriptor;
import com.google.protobuf.Descriptors.FileDescriptor;
import com.google.protobuf.DynamicMessage;
import com.google.protobuf.Message;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF1;
import org.apache.spark.sql.api.java.UDF3;

/**
 * Protobuf records of the schema registry's wire format, decoded in Spark's JVM (mqd typed records,
 * value_format / key_format = "protobuf"; Maven Central serves no spark-protobuf for Spark 4).
 *
 * <p>One rule maps a message to a Spark type ({@link #sparkType}, written as Spark's JSON type
 * text for the driver) and the same walk turns a parsed message into a Row of that type ({@link
 * #row}), so the two cannot disagree. Scalars by kind (uint32 and fixed32 as long, uint64 and
 * fixed64 as decimal(20,0), exact), enums by name, repeated fields as arrays, map fields as maps,
 * nested messages as structs, google.protobuf.Timestamp as a timestamp, the wrapper types as their
 * nullable scalar, Struct / Value / ListValue as their JSON text; a field with presence (a message,
 * proto3 optional, a oneof member, proto2 optional) is null when unset, one without presence its
 * default. A message that contains itself is refused.
 *
 * <p>Entry points: {@code java -cp ... mqd.spark.ProtobufDecode describe <descriptor set> <file>}
 * (the driver's plan: every message of the file with its message-index path and Spark type, as
 * JSON); {@link Path} (UDF: the message-index path of a payload, "0" or "1.2"; null if malformed);
 * this class as UDF (payload, descriptor set, message full name) → Row, null when it does not parse.
 */
public final class ProtobufDecode implements UDF3<byte[], byte[], String, Row> {
  private static final long serialVersionUID = 1L;
  private static final int MAX_INDEXES = 64; // deeper nesting than this is not a real payload

  // descriptor set (sha-256) + message name -> descriptor, shared by the instances of a JVM
  private static final Map<String, Descriptor> DESCRIPTORS = new ConcurrentHashMap<>();

  // this instance's last descriptor: the literal argument is the same array on every call
  private transient byte[] lastSet;
  private transient String lastName;
  private transient Descriptor lastDescriptor;

  @Override
  public Row call(byte[] payload, byte[] descriptorSet, String messageName) {
    if (payload == null) {
      return null;
    }
    Descriptor descriptor;
    if (descriptorSet == lastSet && messageName.equals(lastName)) {
      descriptor = lastDescriptor;
    } else {
      descriptor = descriptor(descriptorSet, messageName);
      lastSet = descriptorSet;
      lastName = messageName;
      lastDescriptor = descriptor;
    }
    try {
      CodedInputStream in = CodedInputStream.newInstance(payload);
      skipIndexes(in);
      DynamicMessage message = DynamicMessage.parseFrom(descriptor, in);
      return row(message);
    } catch (Exception e) { // InvalidProtocolBufferException, a malformed index list
      return null;
    }
  }

  /** The UDF giving a payload's message-index path ("0", "1", "0.2"), null when malformed. */
  public static final class Path implements UDF1<byte[], String> {
    private static final long serialVersionUID = 1L;

    @Override
    public String call(byte[] payload) {
      if (payload == null) {
        return null;
      }
      try {
        return pathText(readIndexes(CodedInputStream.newInstance(payload)));
      } catch (Exception e) {
        return null;
      }
    }
  }

  // -- message indexes ----------------------------------------------------------------------------

  /** The message indexes: a zig-zag varint count, then that many; count 0 means [0]. */
  static int[] readIndexes(CodedInputStream in) throws java.io.IOException {
    int count = in.readSInt32();
    if (count == 0) {
      return new int[] {0};
    }
    if (count < 0 || count > MAX_INDEXES) {
      throw new IllegalArgumentException("message index count " + count);
    }
    int[] out = new int[count];
    for (int i = 0; i < count; i++) {
      out[i] = in.readSInt32();
      if (out[i] < 0) {
        throw new IllegalArgumentException("negative message index");
      }
    }
    return out;
  }

  static void skipIndexes(CodedInputStream in) throws java.io.IOException {
    readIndexes(in);
  }

  static String pathText(int[] indexes) {
    StringBuilder sb = new StringBuilder();
    for (int i = 0; i < indexes.length; i++) {
      if (i > 0) {
        sb.append('.');
      }
      sb.append(indexes[i]);
    }
    return sb.toString();
  }

  // -- descriptors --------------------------------------------------------------------------------

  static Descriptor descriptor(byte[] descriptorSet, String messageName) {
    String key = sha256(descriptorSet) + "/" + messageName;
    return DESCRIPTORS.computeIfAbsent(
        key,
        k -> {
          for (FileDescriptor file : files(descriptorSet).values()) {
            Descriptor d = find(file, messageName);
            if (d != null) {
              return d;
            }
          }
          throw new IllegalArgumentException("no message " + messageName + " in the descriptor set");
        });
  }

  private static Descriptor find(FileDescriptor file, String fullName) {
    for (Descriptor d : file.getMessageTypes()) {
      Descriptor found = findIn(d, fullName);
      if (found != null) {
        return found;
      }
    }
    return null;
  }

  private static Descriptor findIn(Descriptor d, String fullName) {
    if (d.getFullName().equals(fullName)) {
      return d;
    }
    for (Descriptor n : d.getNestedTypes()) {
      Descriptor found = findIn(n, fullName);
      if (found != null) {
        return found;
      }
    }
    return null;
  }

  /** Every file of a FileDescriptorSet (protoc --include_imports: dependencies first), built. */
  static Map<String, FileDescriptor> files(byte[] descriptorSet) {
    try {
      FileDescriptorSet set = FileDescriptorSet.parseFrom(descriptorSet);
      Map<String, FileDescriptor> built = new LinkedHashMap<>();
      for (FileDescriptorProto proto : set.getFileList()) {
        List<FileDescriptor> deps = new ArrayList<>();
        for (String dep : proto.getDependencyList()) {
          FileDescriptor d = built.get(dep);
          if (d == null) {
            throw new IllegalArgumentException(proto.getName() + " imports " + dep + ", not in the set");
          }
          deps.add(d);
        }
        built.put(proto.getName(), FileDescriptor.buildFrom(proto, deps.toArray(new FileDescriptor[0])));
      }
      return built;
    } catch (java.io.IOException | DescriptorValidationException e) {
      throw new IllegalArgumentException("not a usable descriptor set: " + e.getMessage(), e);
    }
  }

  private static String sha256(byte[] data) {
    try {
      byte[] digest = MessageDigest.getInstance("SHA-256").digest(data);
      StringBuilder sb = new StringBuilder();
      for (byte b : digest) {
        sb.append(String.format("%02x", b));
      }
      return sb.toString();
    } catch (java.security.NoSuchAlgorithmException e) {
      throw new IllegalStateException(e);
    }
  }

  // -- the Spark type of a message ----------------------------------------------------------------

  private static final Map<String, String> WRAPPERS = new HashMap<>();

  static {
    WRAPPERS.put("google.protobuf.DoubleValue", "\"double\"");
    WRAPPERS.put("google.protobuf.FloatValue", "\"float\"");
    WRAPPERS.put("google.protobuf.Int64Value", "\"long\"");
    WRAPPERS.put("google.protobuf.UInt64Value", "\"decimal(20,0)\"");
    WRAPPERS.put("google.protobuf.Int32Value", "\"integer\"");
    WRAPPERS.put("google.protobuf.UInt32Value", "\"long\"");
    WRAPPERS.put("google.protobuf.BoolValue", "\"boolean\"");
    WRAPPERS.put("google.protobuf.StringValue", "\"string\"");
    WRAPPERS.put("google.protobuf.BytesValue", "\"binary\"");
  }

  private static final String TIMESTAMP = "google.protobuf.Timestamp";
  private static final java.util.Set<String> AS_JSON =
      java.util.Set.of("google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue");

  /** The Spark type of a message, as Spark's JSON type text (DataType.fromJson reads it). */
  public static String sparkType(Descriptor d) {
    return structType(d, new LinkedHashSet<>());
  }

  private static String structType(Descriptor d, LinkedHashSet<String> path) {
    if (!path.add(d.getFullName())) {
      throw new IllegalArgumentException(
          "recursive message: " + String.join(" -> ", path) + " -> " + d.getFullName());
    }
    StringBuilder sb = new StringBuilder("{\"type\":\"struct\",\"fields\":[");
    boolean first = true;
    for (FieldDescriptor f : d.getFields()) {
      if (!first) {
        sb.append(',');
      }
      first = false;
      sb.append("{\"name\":").append(jsonString(f.getName()));
      sb.append(",\"type\":").append(fieldType(f, path));
      sb.append(",\"nullable\":true,\"metadata\":{}}");
    }
    path.remove(d.getFullName());
    return sb.append("]}").toString();
  }

  private static String fieldType(FieldDescriptor f, LinkedHashSet<String> path) {
    if (f.isMapField()) {
      Descriptor entry = f.getMessageType();
      return "{\"type\":\"map\",\"keyType\":"
          + singleType(entry.findFieldByNumber(1), path)
          + ",\"valueType\":"
          + singleType(entry.findFieldByNumber(2), path)
          + ",\"valueContainsNull\":true}";
    }
    if (f.isRepeated()) {
      return "{\"type\":\"array\",\"elementType\":" + singleType(f, path) + ",\"containsNull\":true}";
    }
    return singleType(f, path);
  }

  private static String singleType(FieldDescriptor f, LinkedHashSet<String> path) {
    switch (f.getType()) {
      case DOUBLE:
        return "\"double\"";
      case FLOAT:
        return "\"float\"";
      case INT32:
      case SINT32:
      case SFIXED32:
        return "\"integer\"";
      case UINT32:
      case FIXED32:
      case INT64:
      case SINT64:
      case SFIXED64:
        return "\"long\"";
      case UINT64:
      case FIXED64:
        return "\"decimal(20,0)\"";
      case BOOL:
        return "\"boolean\"";
      case STRING:
      case ENUM:
        return "\"string\"";
      case BYTES:
        return "\"binary\"";
      case MESSAGE:
      case GROUP:
        Descriptor m = f.getMessageType();
        String name = m.getFullName();
        if (name.equals(TIMESTAMP)) {
          return "\"timestamp\"";
        }
        if (WRAPPERS.containsKey(name)) {
          return WRAPPERS.get(name);
        }
        if (AS_JSON.contains(name)) {
          return "\"string\"";
        }
        return structType(m, path);
      default:
        throw new IllegalArgumentException("field " + f.getFullName() + ": type " + f.getType());
    }
  }

  // -- a message as a Row of its Spark type -------------------------------------------------------

  static Row row(Message m) {
    List<FieldDescriptor> fields = m.getDescriptorForType().getFields();
    Object[] values = new Object[fields.size()];
    for (int i = 0; i < values.length; i++) {
      FieldDescriptor f = fields.get(i);
      if (f.isMapField()) {
        Map<Object, Object> map = new LinkedHashMap<>();
        for (Object e : (List<?>) m.getField(f)) {
          Message entry = (Message) e;
          FieldDescriptor kf = entry.getDescriptorForType().findFieldByNumber(1);
          FieldDescriptor vf = entry.getDescriptorForType().findFieldByNumber(2);
          map.put(single(kf, entry.getField(kf)), entry.hasField(vf) || !vf.hasPresence()
              ? single(vf, entry.getField(vf)) : null);
        }
        values[i] = map;
      } else if (f.isRepeated()) {
        List<?> items = (List<?>) m.getField(f);
        List<Object> out = new ArrayList<>(items.size());
        for (Object item : items) {
          out.add(single(f, item));
        }
        values[i] = out;
      } else if (f.hasPresence() && !m.hasField(f)) {
        values[i] = null;
      } else {
        values[i] = single(f, m.getField(f));
      }
    }
    return RowFactory.create(values);
  }

  private static Object single(FieldDescriptor f, Object v) {
    switch (f.getType()) {
      case UINT32:
      case FIXED32:
        return Integer.toUnsignedLong((Integer) v);
      case UINT64:
      case FIXED64:
        return new BigDecimal(new BigInteger(Long.toUnsignedString((Long) v)));
      case ENUM:
        EnumValueDescriptor e = (EnumValueDescriptor) v;
        // an open enum's number the schema does not name reads as the number
        return e.getType().findValueByNumber(e.getNumber()) != null
            ? e.getName()
            : Integer.toString(e.getNumber());
      case BYTES:
        return ((ByteString) v).toByteArray();
      case MESSAGE:
      case GROUP:
        Message m = (Message) v;
        String name = m.getDescriptorForType().getFullName();
        if (name.equals(TIMESTAMP)) {
          Descriptor d = m.getDescriptorForType();
          long seconds = (Long) m.getField(d.findFieldByNumber(1));
          int nanos = (Integer) m.getField(d.findFieldByNumber(2));
          return Instant.ofEpochSecond(seconds, nanos);
        }
        if (WRAPPERS.containsKey(name)) {
          FieldDescriptor value = m.getDescriptorForType().findFieldByNumber(1);
          return single(value, m.getField(value));
        }
        if (AS_JSON.contains(name)) {
          StringBuilder sb = new StringBuilder();
          json(m, sb);
          return sb.toString();
        }
        return row(m);
      default:
        return v; // Double, Float, Integer, Long, Boolean, String as Spark takes them
    }
  }

  // google.protobuf.Struct / Value / ListValue as the JSON they stand for
  private static void json(Message m, StringBuilder sb) {
    Descriptor d = m.getDescriptorForType();
    switch (d.getFullName()) {
      case "google.protobuf.Struct":
        sb.append('{');
        boolean first = true;
        for (Object e : (List<?>) m.getField(d.findFieldByName("fields"))) {
          Message entry = (Message) e;
          Descriptor ed = entry.getDescriptorForType();
          if (!first) {
            sb.append(',');
          }
          first = false;
          sb.append(jsonString((String) entry.getField(ed.findFieldByNumber(1)))).append(':');
          json((Message) entry.getField(ed.findFieldByNumber(2)), sb);
        }
        sb.append('}');
        return;
      case "google.protobuf.ListValue":
        sb.append('[');
        List<?> items = (List<?>) m.getField(d.findFieldByName("values"));
        for (int i = 0; i < items.size(); i++) {
          if (i > 0) {
            sb.append(',');
          }
          json((Message) items.get(i), sb);
        }
        sb.append(']');
        return;
      default: // Value: its oneof kind
        FieldDescriptor set = m.getOneofFieldDescriptor(d.getOneofs().get(0));
        if (set == null || set.getName().equals("null_value")) {
          sb.append("null");
        } else if (set.getName().equals("number_value")) {
          double x = (Double) m.getField(set);
          sb.append(Double.isFinite(x) ? Double.toString(x) : jsonString(Double.toString(x)));
        } else if (set.getName().equals("string_value")) {
          sb.append(jsonString((String) m.getField(set)));
        } else if (set.getName().equals("bool_value")) {
          sb.append(m.getField(set));
        } else {
          json((Message) m.getField(set), sb);
        }
    }
  }

  static String jsonString(String s) {
    StringBuilder sb = new StringBuilder("\"");
    for (int i = 0; i < s.length(); i++) {
      char c = s.charAt(i);
      if (c == '"' || c == '\\') {
        sb.append('\\').append(c);
      } else if (c < 0x20) {
        sb.append(String.format("\\u%04x", (int) c));
      } else {
        sb.append(c);
      }
    }
    return sb.append('"').toString();
  }

  // -- the driver's plan --------------------------------------------------------------------------

  /**
   * Every message of {@code fileName} in the set, depth first, as a JSON line: {"path": "1.0",
   * "name": full name, "type": Spark type | null, "error": why not | null}.
   */
  static String describe(byte[] descriptorSet, String fileName) {
    FileDescriptor file = files(descriptorSet).get(fileName);
    if (file == null) {
      throw new IllegalArgumentException("no file " + fileName + " in the descriptor set");
    }
    StringBuilder sb = new StringBuilder("{\"messages\":[");
    List<Descriptor> top = file.getMessageTypes();
    boolean[] first = {true};
    for (int i = 0; i < top.size(); i++) {
      describeInto(top.get(i), Integer.toString(i), sb, first);
    }
    return sb.append("]}").toString();
  }

  private static void describeInto(Descriptor d, String path, StringBuilder sb, boolean[] first) {
    if (d.getOptions().getMapEntry()) {
      return;
    }
    if (!first[0]) {
      sb.append(',');
    }
    first[0] = false;
    sb.append("{\"path\":").append(jsonString(path)).append(",\"name\":").append(jsonString(d.getFullName()));
    try {
      String type = sparkType(d); // whole or not at all
      sb.append(",\"type\":").append(type).append(",\"error\":null}");
    } catch (IllegalArgumentException e) {
      sb.append(",\"type\":null,\"error\":").append(jsonString(e.getMessage())).append('}');
    }
    List<Descriptor> nested = d.getNestedTypes();
    for (int j = 0; j < nested.size(); j++) {
      describeInto(nested.get(j), path + "." + j, sb, first);
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length == 3 && args[0].equals("describe")) {
      byte[] set = java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(args[1]));
      try {
        System.out.println(describe(set, args[2]));
      } catch (IllegalArgumentException e) {
        System.out.println("{\"error\":" + jsonString(String.valueOf(e.getMessage())) + "}");
      }
      return;
    }
    if (args.length == 4 && args[0].equals("decode")) { // a check by hand: one payload as a Row
      byte[] set = java.nio.file.Files.readAllBytes(java.nio.file.Paths.get(args[1]));
      byte[] payload = Base64.getDecoder().decode(args[3].getBytes(StandardCharsets.US_ASCII));
      System.out.println(new ProtobufDecode().call(payload, set, args[2]));
      return;
    }
    System.err.println("usage: describe <descriptor set> <file> | decode <descriptor set> <message> <base64>");
    System.exit(2);
  }
}
